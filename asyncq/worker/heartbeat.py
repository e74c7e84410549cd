"""The heartbeat: renews the lease of every attempt this worker holds, well inside the
lease (every quarter of it), on the worker's own pool, so that jobs holding the App's
connections cannot starve it. An attempt whose lease is gone (reaped, or claimed again
elsewhere) is lost: the dispatcher stops it, since its outcome could not be written. An
attempt a cancel asked to stop is stopped here, if its notification did not come.

Each renewal that succeeds tells the dispatcher when it was sent: an attempt not renewed
for most of a lease is stopped by the dispatcher's self-fence, on a timer of its own, so
a renewal hung on a dead connection (until its deadline) cannot hold that back. After a
renewal fails, the next is tried a quarter of an interval later, not a whole one: after
a server restart the pool's new connections come a second or two after the server is
back, and a renewal must get through before the fence (0.8 of the lease) stops the jobs."""

from __future__ import annotations

import asyncio

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.store import Store
from asyncq.worker.dispatch import Dispatcher, State
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
        self._failing = False  # the last renewal failed: try again soon
        # Within its interval: a renewal never overlaps the next one. At the pace of the
        # renewals before it: one stuck on a dead connection is tried again on another.
        self.pace = pools.Pace(interval)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await every(self.name, self._next_in, self.beat, self.observer)

    def _next_in(self) -> float:
        return self.interval / 4 if self._failing else self.interval

    async def beat(self) -> None:
        attempts = self.dispatcher.attempts()
        if not attempts:
            self._failing = False
            return
        self._failing = True  # until it succeeds
        async with pools.connection(self.pool, self.pace) as conn:
            # Just before the statement is sent: the database renews each lock after this.
            sent = asyncio.get_running_loop().time()
            kept = await self.store.heartbeat(
                conn, worker=self.worker, jobs=[a.job for a in attempts]
            )
        self.beats += 1
        self._failing = False
        for attempt in attempts:
            aborted = kept.get(attempt.job.id)
            if aborted is None:
                # An attempt that has ended waits for its outcome's write, which may have
                # ended the job before this renewal ran, its answer still on its way (the
                # two retried together after a fault, say): the write's fence tells.
                ended = attempt.state is State.ENDED
                if self.dispatcher.held.get(attempt.job.id) is attempt and not ended:
                    self.dispatcher.lose(attempt, "reaped or claimed elsewhere")
                continue
            self.dispatcher.renewed(attempt, sent)
            if aborted and attempt.stop is None:
                # The cancel's notification was lost (or came while the listener was away).
                self.dispatcher.abort(attempt.job.id, attempt.job.claim)
