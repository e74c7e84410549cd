"""The reaper: returns jobs whose lease expired to the queue (or to failed once their
attempts are used up) and prunes done rows past the retention period.

Every worker runs one; an advisory lock lets one at a time do the work.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from asyncq.store import Store

logger = logging.getLogger(__name__)

REAP_LIMIT = 1000
PRUNE_LIMIT = 10_000


class Reaper:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        schema: str,
        interval: float,
        retention: timedelta,
        prune_interval: float = 60.0,
    ) -> None:
        self.pool = pool
        self.store = store
        self.schema = schema
        self.interval = interval
        self.retention = retention
        self.prune_interval = prune_interval
        self.reaped = 0
        self._next_prune = 0.0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                with anyio.fail_after(max(self.interval, 5.0) * 2):
                    await self.once()
            except (psycopg.Error, PoolTimeout, OSError, TimeoutError) as exc:
                logger.warning(
                    "reaper pass failed (%s)", type(exc).__name__, extra={"action": "reap_failed"}
                )
            await anyio.sleep(self.interval)

    async def once(self) -> None:
        async with self.pool.connection() as conn:
            reaped = await self.store.reap_expired(conn, schema=self.schema, limit=REAP_LIMIT)
        if reaped is None:
            return  # another worker's reaper holds the lock
        for job_id, status in reaped.items():
            self.reaped += 1
            logger.warning(
                "job %d: its worker stopped renewing the lease; now %s",
                job_id,
                status,
                extra={"action": "job_reaped", "job_id": job_id},
            )
        now = anyio.current_time()
        if now >= self._next_prune:
            self._next_prune = now + self.prune_interval
            pruned = PRUNE_LIMIT
            while pruned == PRUNE_LIMIT:  # a connection per batch: the heartbeat shares the pool
                async with self.pool.connection() as conn:
                    pruned = await self.store.prune_done(
                        conn, retention=self.retention, limit=PRUNE_LIMIT
                    )
