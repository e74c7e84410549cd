"""The completer: writes outcomes in batches, one statement per kind, fenced per attempt.

Outcomes that arrive while a write is in flight are written together by the
next one, so batches grow with load and a lone job is written at once.
A job stays held (and its lease renewed) until its outcome is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from asyncq.job import Job
from asyncq.pools import KeptConnection
from asyncq.store import Conn, Store
from asyncq.worker.executor import Outcome
from asyncq.worker.state import backoff_delay

logger = logging.getLogger(__name__)

MAX_BATCH = 1000


class Completer:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        worker: str,
        on_written: Callable[[Job], None],
    ) -> None:
        self.kept = KeptConnection(pool)
        self.store = store
        self.worker = worker
        self.on_written = on_written
        self._pending: list[Outcome] = []
        self._arrived = asyncio.Event()
        self._closed = False
        self.done = 0
        self.failed_attempts = 0

    def submit(self, outcome: Outcome) -> None:
        self._pending.append(outcome)
        self._arrived.set()

    def close(self) -> None:
        """No more outcomes: `run` writes what it has and returns."""
        self._closed = True
        self._arrived.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await self._run()
        finally:
            await self.kept.release()

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._closed:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            batch = self._pending[:MAX_BATCH]
            del self._pending[:MAX_BATCH]
            await self._write(batch)

    async def _write(self, batch: list[Outcome]) -> None:
        failures = 0
        while True:
            try:
                await self._write_once(batch)
                return
            except (psycopg.Error, PoolTimeout, OSError) as exc:
                failures += 1
                delay = backoff_delay(failures)
                logger.warning(
                    "could not write %d outcomes (%s); retrying in %.1fs",
                    len(batch),
                    type(exc).__name__,
                    delay,
                    extra={"action": "complete_failed"},
                )
                await anyio.sleep(delay)

    async def _write_once(self, batch: list[Outcome]) -> None:
        succeeded = [o.job for o in batch if o.succeeded]
        failed = [o for o in batch if not o.succeeded]
        async with self.kept.connection() as conn, _together(conn, succeeded and failed):
            if succeeded:
                owned = await self.store.mark_done(
                    conn,
                    worker=self.worker,
                    ids=[j.id for j in succeeded],
                    attempts=[j.attempt for j in succeeded],
                )
                self.done += len(owned)
                for job in succeeded:
                    if job.id not in owned:
                        _log_lost(job.id, job.attempt, "success")
            if failed:
                statuses = await self.store.mark_failed(
                    conn,
                    worker=self.worker,
                    ids=[o.job.id for o in failed],
                    attempts=[o.job.attempt for o in failed],
                    retry_in=[o.retry_in for o in failed],
                    errors=[o.error or "" for o in failed],
                    give_up=[False] * len(failed),
                )
                self.failed_attempts += len(failed)
                for o in failed:
                    _log_failure(o, statuses.get(o.job.id))
        for outcome in batch:
            self.on_written(outcome.job)


def _together(conn: Conn, both: object) -> AbstractAsyncContextManager[object]:
    """One transaction when both statements run, so a retry never repeats half a write."""
    return conn.transaction() if both else nullcontext()


def _log_lost(job_id: int, attempt: int, what: str) -> None:
    logger.warning(
        "job %d: lease lost before its %s was written (attempt %d); the result is dropped",
        job_id,
        what,
        attempt,
        extra={"action": "lease_lost", "job_id": job_id},
    )


def _log_failure(outcome: Outcome, status: str | None) -> None:
    job = outcome.job
    first_line = (outcome.error or "").splitlines()[0] if outcome.error else ""
    if status is None:
        _log_lost(job.id, job.attempt, "failure")
    elif status == "failed":
        logger.error(
            "job %d (%s) failed for good after attempt %d of %d: %s",
            job.id,
            job.task_name,
            job.attempt,
            job.max_attempts,
            first_line,
            extra={"action": "job_failed", "job_id": job.id},
        )
    else:
        logger.warning(
            "job %d (%s) attempt %d of %d failed, retrying in %.1fs: %s",
            job.id,
            job.task_name,
            job.attempt,
            job.max_attempts,
            outcome.retry_in,
            first_line,
            extra={"action": "job_retry", "job_id": job.id},
        )
