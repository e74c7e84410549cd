"""The heartbeat: renews the lease of every job this worker holds, well inside the lease.

It has its own connection (the control pool), so jobs that hold every
connection of the main pool cannot starve it. A job whose lease is gone
(reaped, or claimed again elsewhere) is cancelled here: its result would be
dropped anyway.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from asyncq.store import Store
from asyncq.worker.state import Held

logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        worker: str,
        held: MutableMapping[int, Held],
        interval: float,
    ) -> None:
        self.pool = pool
        self.store = store
        self.worker = worker
        self.held = held
        self.interval = interval
        self.beats = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await anyio.sleep(self.interval)
            try:
                with anyio.fail_after(self.interval):
                    await self.beat()
            except (psycopg.Error, PoolTimeout, OSError, TimeoutError) as exc:
                logger.warning(
                    "heartbeat failed (%s); next try in %.1fs",
                    type(exc).__name__,
                    self.interval,
                    extra={"action": "heartbeat_failed"},
                )

    async def beat(self) -> None:
        snapshot = [(h.job.id, h.job.attempt) for h in self.held.values()]
        if not snapshot:
            return
        async with self.pool.connection() as conn:
            kept = await self.store.heartbeat(
                conn,
                worker=self.worker,
                ids=[job_id for job_id, _ in snapshot],
                attempts=[attempt for _, attempt in snapshot],
            )
        self.beats += 1
        for job_id, attempt in snapshot:
            held = self.held.get(job_id)
            if job_id in kept or held is None or held.job.attempt != attempt:
                continue
            if held.executing and not held.lost:
                held.lost = True
                held.cancel()
                logger.warning(
                    "job %d: lease lost during attempt %d (reaped or claimed elsewhere);"
                    " cancelling it here",
                    job_id,
                    attempt,
                    extra={"action": "lease_lost", "job_id": job_id},
                )
