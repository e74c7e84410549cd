"""PgQueuer: asyncpg driver, a ``QueueManager`` with ``batch_size``, asyncio entrypoints.

A QueueManager dequeues ``batch_size`` jobs per query and runs each as an asyncio
task (no cap unless ``max_concurrent_tasks`` is set), then deletes finished jobs
from the queue table and logs them, in buffered batches. ``mode=drain`` returns
once the queue is empty. The asyncpg driver is the one PgQueuer's own benchmark
uses by default; ``BENCH_PGQUEUER_DRIVER=psy`` switches to psycopg.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.common import asyncpg_kwargs, connect, report_latency
from benchmarks.systems import Point, Ready, System, WorkerOptions

NOOP = "bench.noop"
STAMP = "bench.stamp"
DRIVER = os.environ.get("BENCH_PGQUEUER_DRIVER", "apg")


async def make_queries(dsn: str, driver: str = DRIVER) -> tuple[Any, Any]:
    """(Queries, connection) over one connection of the chosen driver."""
    from pgqueuer import AsyncpgDriver, PsycopgDriver
    from pgqueuer.queries import Queries

    if driver == "psy":
        conn: Any = await connect(dsn)
        return Queries(PsycopgDriver(conn)), conn
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(dsn))
    return Queries(AsyncpgDriver(conn)), conn


class PgqueuerSystem(System):
    name = "pgqueuer"
    title = "PgQueuer"
    unfinished_sql = "SELECT EXISTS (SELECT 1 FROM pgqueuer)"
    completed_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
    tables = ("pgqueuer", "pgqueuer_log")

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.queries: Any = None
        self.conn: Any = None
        self.pool: Any = None
        self.pool_queries: Any = None

    async def install(self) -> None:
        queries, conn = await make_queries(self.dsn)
        try:
            await queries.install()
        finally:
            await conn.close()

    async def open(self) -> None:
        self.queries, self.conn = await make_queries(self.dsn)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def reset(self) -> None:
        await self.queries.driver.execute(
            "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY"
        )

    async def enqueue_bulk(self, count: int) -> None:
        await self.queries.enqueue([NOOP] * count, [None] * count, [0] * count)

    async def enqueue_one(self) -> None:
        await self.queries.enqueue(NOOP, None)

    async def enqueue_stamp(self, sent_at: float) -> None:
        await self.queries.enqueue(STAMP, repr(sent_at).encode())

    async def enqueue_concurrent_setup(self, coroutines: int) -> None:
        # One asyncpg connection serialises its queries: concurrent enqueuers share a pool.
        import asyncpg
        from pgqueuer import AsyncpgPoolDriver
        from pgqueuer.queries import Queries

        self.pool = await asyncpg.create_pool(**asyncpg_kwargs(self.dsn), min_size=10, max_size=10)
        self.pool_queries = Queries(AsyncpgPoolDriver(self.pool))

    async def enqueue_concurrent_one(self) -> None:
        await self.pool_queries.enqueue(NOOP, None)

    async def enqueue_concurrent_teardown(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        # concurrency 0: PgQueuer's default, no cap on the tasks of a QueueManager.
        return [Point(0, b) for b in ((10, 100) if quick else (10, 50, 100))]

    @staticmethod
    def default_point() -> Point:
        # QueueManager.run()'s defaults: batch_size 10, max_concurrent_tasks None.
        return Point(0, 10)

    @staticmethod
    def latency_point() -> Point:
        return Point(0, 10)


SYSTEM = PgqueuerSystem


async def work(options: WorkerOptions, ready: Ready) -> None:
    from pgqueuer import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode
    from pgqueuer.models import Job

    queries, conn = await make_queries(options.dsn, options.variant or DRIVER)
    qm = QueueManager(queries)

    @qm.entrypoint(NOOP)
    async def noop(job: Job) -> None:
        pass

    @qm.entrypoint(STAMP)
    async def stamp(job: Job) -> None:
        assert job.payload is not None
        report_latency(float(job.payload.decode()))

    mode = QueueExecutionMode.drain if options.mode == "drain" else QueueExecutionMode.continuous
    try:
        await ready()
        await qm.run(
            batch_size=options.batch,
            mode=mode,
            max_concurrent_tasks=options.concurrency or None,
        )
    finally:
        await conn.close()
