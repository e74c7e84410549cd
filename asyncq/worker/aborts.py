"""Polled aborts: for a worker without a LISTEN connection (``App(listen=False)``), which
hears of no cancel. Every poll interval, while it runs attempts, it asks the database
which of them a cancel asked to stop (one read, fenced by claim) and stops them, as the
listener does when told; the heartbeat would find them too, but only every quarter of
the lease."""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.store import Store
from asyncq.worker.dispatch import Dispatcher
from asyncq.worker.observer import Observer
from asyncq.worker.services import every

# A look slower than this (or than its pace: `asyncq.pools.Pace`) loses its connection,
# is reported, and is tried again at the next turn.
LOOK_DEADLINE = 5.0


class AbortPoll:
    name = "aborts"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        worker: str,
        dispatcher: Dispatcher,
        interval: float,
        observer: Observer,
    ) -> None:
        self.pool = pool
        self.store = store
        self.worker = worker
        self.dispatcher = dispatcher
        self.interval = interval
        self.observer = observer
        self.pace = pools.Pace(LOOK_DEADLINE)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        interval = self.interval
        await every(self.name, lambda: interval, self.look, self.observer)

    async def look(self) -> None:
        attempts = [a for a in self.dispatcher.attempts() if a.stop is None]
        if not attempts:
            return
        async with pools.connection(self.pool, self.pace) as conn:
            asked = await self.store.aborts_requested(
                conn, worker=self.worker, jobs=[a.job for a in attempts]
            )
        for attempt in attempts:
            if attempt.job.id in asked:
                self.dispatcher.abort(attempt.job.id, attempt.job.claim)
