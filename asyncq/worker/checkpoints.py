"""The worker's side of its jobs' workflows (`asyncq.workflow.Gateway`): steps' checkpoints
written in batches, the progress tasks report, and the other writes of a running job (a
sleep, a wait, children) one statement each, all fenced by the job's claim.

A step's checkpoint waits in a batch: those that arrive while a write is in flight go
together in the next one, so that the steps of many jobs that end at once cost one round
trip; a lone step is written at once. A transient error is retried (a write whose answer
was lost is found written: 'exists'). A job suspended, or whose lease is lost, is no
longer held by the dispatcher (`release`), so that the heartbeat stops renewing it.

Progress (``ctx.progress``) is coalesced: each job's latest report waits in `reported`,
and one statement writes the reports of every job that has a new one, at most every
`PROGRESS_EVERY` seconds. A report not written when its attempt ends is taken by the
runner (`take_progress`) and written with the attempt's outcome; one whose job is no
longer this attempt's is refused by the fence, and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import anyio
from anyio.abc import TaskStatus
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.job import Job
from asyncq.pools import KeptConnection
from asyncq.store import Store
from asyncq.worker.observer import Observer
from asyncq.worker.services import retrying
from asyncq.workflow import Ending, Spawn, Wait

MAX_BATCH = 1000
PROGRESS_EVERY = 0.25


class _Pending:
    __slots__ = ("done", "job", "name", "result", "seq", "started")

    def __init__(self, job: Job, name: str, seq: int, result: str, started: datetime) -> None:
        self.job = job
        self.name = name
        self.seq = seq
        self.result = result
        self.started = started
        self.done: asyncio.Future[tuple[str, str | None]] = (
            asyncio.get_running_loop().create_future()
        )


class Checkpoints:
    name = "checkpoints"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        app_pool: Callable[[], AsyncConnectionPool],
        store: Store,
        worker: str,
        observer: Observer,
        release: Callable[[Job], None],
        lost: Callable[[Job, str], None],
    ) -> None:
        self.pool = pool
        self.app_pool = app_pool
        self.kept = KeptConnection(pool)
        self.store = store
        self.worker = worker
        self.observer = observer
        self._release = release
        self._lost = lost
        self._pending: list[_Pending] = []
        self._arrived = asyncio.Event()
        # The latest progress of each running attempt, by (job id, claim), until it ends;
        # the attempts with a report not yet written; and how to wake the writer.
        self.reported: dict[tuple[int, int], str] = {}
        self._unwritten: dict[tuple[int, int], Job] = {}
        self._lock = threading.Lock()
        self._reports = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    # -- the service: batched checkpoints ----------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        async with anyio.create_task_group() as group:
            group.start_soon(self._write_progress_often)
            task_status.started()
            await self._write_steps()

    async def _write_steps(self) -> None:
        try:
            while True:
                if not self._pending:
                    self._arrived.clear()
                    await self._arrived.wait()
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                try:
                    await retrying(self.name, partial(self._write, batch), self.observer)
                except BaseException as exc:
                    for step in batch:
                        if not step.done.done():
                            step.done.set_exception(
                                exc if isinstance(exc, Exception) else asyncio.CancelledError()
                            )
                    raise
        finally:
            await self.kept.release()

    async def _write(self, batch: list[_Pending]) -> None:
        async with self.kept.connection() as conn:
            rows = await self.store.write_steps(
                conn,
                worker=self.worker,
                jobs=[s.job for s in batch],
                names=[s.name for s in batch],
                seqs=[s.seq for s in batch],
                results=[s.result for s in batch],
                started=[s.started for s in batch],
            )
        found = {(job_id, name, seq): (state, stored) for job_id, name, seq, state, stored in rows}
        for step in batch:
            outcome = found.get((step.job.id, step.name, step.seq), ("lost", None))
            if not step.done.done():
                step.done.set_result(outcome)

    # -- progress ------------------------------------------------------------------------

    def report_progress(self, job: Job, progress: str) -> None:
        key = (job.id, job.claim)
        with self._lock:
            self.reported[key] = progress
            self._unwritten[key] = job
        loop = self._loop
        if threading.get_ident() == self._loop_thread:
            self._reports.set()
        elif loop is not None:  # a plain def task's thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
                loop.call_soon_threadsafe(self._reports.set)

    def take_progress(self, job: Job) -> str | None:
        """The latest progress of ``job``'s attempt, which has ended, unless none was
        reported: to write with its outcome (it may be written already)."""
        key = (job.id, job.claim)
        with self._lock:
            self._unwritten.pop(key, None)
            return self.reported.pop(key, None)

    async def _write_progress_often(self) -> None:
        while True:
            await self._reports.wait()
            self._reports.clear()
            with self._lock:
                unwritten, self._unwritten = self._unwritten, {}
                batch = [
                    (job, self.reported[key])
                    for key, job in unwritten.items()
                    if key in self.reported
                ]
            if batch:
                await retrying(self.name, partial(self._write_progress, batch), self.observer)
            await anyio.sleep(PROGRESS_EVERY)

    async def _write_progress(self, batch: list[tuple[Job, str]]) -> None:
        async with pools.connection(self.pool) as conn:
            await self.store.write_progress(
                conn,
                worker=self.worker,
                jobs=[job for job, _ in batch],
                progress=[text for _, text in batch],
            )

    # -- the gateway ---------------------------------------------------------------------

    async def load_steps(self, job: Job) -> dict[tuple[str, int], str | None]:
        async with pools.connection(self.pool) as conn:
            return await self.store.job_steps(conn, job_id=job.id)

    async def write_step(
        self, job: Job, name: str, seq: int, result: str, started: datetime
    ) -> tuple[str, str | None]:
        step = _Pending(job, name, seq, result, started)
        self._pending.append(step)
        self._arrived.set()
        return await step.done

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        # The step's own statements take what they take: no deadline of asyncq's.
        async with self.app_pool().connection() as conn, conn.transaction():
            yield conn

    async def write_step_in(
        self,
        conn: AsyncConnection[Any],
        job: Job,
        name: str,
        seq: int,
        result: str,
        started: datetime,
    ) -> tuple[str, str | None]:
        return await self.store.write_step_in_transaction(
            conn, worker=self.worker, job=job, name=name, seq=seq, result=result, started=started
        )

    async def suspend(self, job: Job, wait: Wait) -> tuple[str, str | None, datetime | None]:
        async def call() -> tuple[str, str | None, datetime | None]:
            async with pools.connection(self.pool) as conn:
                return await self.store.suspend(
                    conn,
                    worker=self.worker,
                    job=job,
                    kind=wait.kind,
                    until=wait.until,
                    seconds=wait.seconds,
                    key=wait.key,
                    awaited=wait.awaited,
                    step=wait.step,
                    seq=wait.seq,
                )

        return await retrying(self.name, call, self.observer)

    async def spawn(self, job: Job, spawn: Spawn) -> list[int] | None:
        async def call() -> list[int] | None:
            async with pools.connection(self.pool) as conn:
                return await self.store.spawn(
                    conn,
                    worker=self.worker,
                    job=job,
                    step=spawn.step,
                    seq=spawn.seq,
                    task_name=spawn.task_name,
                    queue=spawn.queue,
                    args=spawn.args,
                    priority=spawn.priority,
                    max_attempts=spawn.max_attempts,
                )

        return await retrying(self.name, call, self.observer)

    async def endings(self, ids: Sequence[int]) -> list[Ending]:
        async def call() -> list[Ending]:
            async with pools.connection(self.pool) as conn:
                found = await self.store.job_endings(conn, ids=ids)
            return [Ending(e.id, e.status, e.result, e.last_error) for e in found]

        return await retrying(self.name, call, self.observer)

    def suspended(self, job: Job) -> None:
        self._release(job)

    def lost(self, job: Job, why: str) -> None:
        self._lost(job, why)
