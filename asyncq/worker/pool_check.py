"""The pool check: now and then one idle connection of the App's pool (which the worker
itself does not use: only its tasks and their defers do) makes a round trip; a broken
one is discarded, and the pool opens another. The pool hands out its connections first
in, first out, so one check after another reaches each of them. Without it, after a
server restart or a failover, a dead connection could sit in the pool until a task
took it and failed."""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.worker.observer import Observer
from asyncq.worker.services import every

INTERVAL = 5.0


class PoolCheck:
    name = "pool_check"

    def __init__(self, *, pool: AsyncConnectionPool, observer: Observer) -> None:
        self.pool = pool
        self.observer = observer
        self.pace = pools.Pace(INTERVAL)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await every(self.name, lambda: INTERVAL, self.check_one, self.observer)

    async def check_one(self) -> None:
        if not self.pool.get_stats().get("pool_available"):
            return  # every connection is in use, and so known to work, or soon not to
        async with pools.connection(self.pool, self.pace) as conn:
            await conn.execute("")
