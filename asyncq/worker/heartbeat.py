"""The heartbeat: renews the lease of every attempt this worker holds, well inside the
lease (every quarter of it), on the worker's own pool, so that jobs holding the App's
connections cannot starve it. An attempt whose lease is gone (reaped, or claimed again
elsewhere) is lost: the dispatcher stops it, since its outcome could not be written. An
attempt a cancel asked to stop is stopped here, if its notification did not come.

Each renewal that succeeds tells the dispatcher when it was sent: an attempt not renewed
for most of a lease is stopped by the dispatcher's self-fence, on a timer of its own, so
a renewal hung on a dead connection (until its deadline) cannot hold that back."""

from __future__ import annotations

import asyncio

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.store import Store
from asyncq.worker.dispatch import Dispatcher
from asyncq.worker.observer import Observer
from asyncq.worker.services import every


class Heartbeat:
    name = "heartbeat"

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
        self.beats = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        interval = self.interval
        await every(self.name, lambda: interval, self.beat, self.observer)

    async def beat(self) -> None:
        attempts = self.dispatcher.attempts()
        if not attempts:
            return
        # Within its interval: a renewal never overlaps the next one.
        async with pools.connection(self.pool, self.interval) as conn:
            # Just before the statement is sent: the database renews each lock after this.
            sent = asyncio.get_running_loop().time()
            kept = await self.store.heartbeat(
                conn, worker=self.worker, jobs=[a.job for a in attempts]
            )
        self.beats += 1
        for attempt in attempts:
            aborted = kept.get(attempt.job.id)
            if aborted is None:
                if self.dispatcher.held.get(attempt.job.id) is attempt:
                    self.dispatcher.lose(attempt, "reaped or claimed elsewhere")
                continue
            self.dispatcher.renewed(attempt, sent)
            if aborted and attempt.stop is None:
                # The cancel's notification was lost (or came while the listener was away).
                self.dispatcher.abort(attempt.job.id, attempt.job.claim)
