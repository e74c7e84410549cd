"""Jobs of tasks no worker knows: given back by each worker that claimed them (and claims
no more of them), they fail once they have waited the grace (``--unknown-task-grace``)
since the first give-back without a worker that knows the task taking them."""

from __future__ import annotations

from datetime import timedelta

from asyncq.store import Conn, Store

FAIL_LIMIT = 1000


class UnknownTasks:
    name = "unknown-tasks"

    def __init__(self, *, store: Store, interval: float, grace: timedelta) -> None:
        self.store = store
        self.interval = interval
        self.grace = grace

    async def run(self, conn: Conn) -> bool:
        failed = await self.store.fail_unknown(conn, grace=self.grace, limit=FAIL_LIMIT)
        return len(failed) >= FAIL_LIMIT
