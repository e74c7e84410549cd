"""The waker: wakes the waiting jobs that come due (a durable sleep's end, a wait's
timeout) when they do, without polling them.

Each suspension with a time to come due is announced on the wake-up channel (the listener
sets a timer for it); after each pass the waker asks the database when the next one comes
due, and sets a timer for that too, so that a missed announcement costs nothing. A pass
queues the due jobs, whose requeue wakes the claim loops. Every worker does it, for the
jobs of every queue: a job taken by another worker's pass is skipped.
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.store import Store
from asyncq.transient import TRANSIENT_ERRORS, is_transient
from asyncq.worker.observer import Observer
from asyncq.worker.services import Tries
from asyncq.worker.wakeup import DueTimes, Wakeup

WAKE_LIMIT = 1000


class Waker:
    name = "waker"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        wakeup: Wakeup,
        due: DueTimes,
        poll_interval: float | None,
        observer: Observer,
    ) -> None:
        self.pool = pool
        self.store = store
        self.wakeup = wakeup
        self.due = due
        self.poll_interval = poll_interval  # without a listener: how often to look
        self.observer = observer

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        tries = Tries(self.name, self.observer)
        self.wakeup.set()  # a first look, at the start
        while True:
            await self.wakeup.wait(self.poll_interval)
            try:
                await self._pass()
            except TRANSIENT_ERRORS as exc:
                if not is_transient(exc):
                    raise
                await anyio.sleep(tries.wait_after(exc))
                self.wakeup.set()
            else:
                tries.succeeded()

    async def _pass(self) -> None:
        # Once begun, a pass ends (within its deadline) before a shutdown's cancellation
        # reaches it: a statement cancelled mid-way costs its connection.
        with anyio.CancelScope(shield=True):
            async with pools.connection(self.pool) as conn:
                while await self.store.wake_due(conn, limit=WAKE_LIMIT) >= WAKE_LIMIT:
                    pass
                seconds = await self.store.next_wake(conn)
        if seconds is not None:
            self.due.add(seconds)
