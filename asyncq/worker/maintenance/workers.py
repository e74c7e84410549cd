"""The rows of workers that died (asyncq_workers rows not refreshed for three of their
beats, shown as dead by ``asyncq workers``), deleted once they have not been refreshed
for `FORGET_AFTER`. A role without rights on that table skips it."""

from __future__ import annotations

from datetime import timedelta

from psycopg import errors

from asyncq.store import Conn, Store

FORGET_AFTER = timedelta(hours=1)


class DeadWorkers:
    name = "dead-workers"

    def __init__(self, *, store: Store, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.refused = False

    async def run(self, conn: Conn) -> bool:
        if self.refused:
            return False
        try:
            # A savepoint: refused, the gate's transaction goes on.
            async with conn.transaction():
                await self.store.prune_workers(conn, after=FORGET_AFTER)
        except errors.InsufficientPrivilege:
            self.refused = True
        return False
