"""procrastinate 3: the psycopg async connector, its worker with ``concurrency``.

Its worker claims one job per query (``procrastinate_fetch_job_v2``), so there is
no batch size to set: the sweep is over concurrency. With ``wait=False`` the
worker returns once it finds no job, which is its drain mode.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import report_latency
from benchmarks.systems import Point, Ready, System, WorkerOptions

NOOP = "bench.noop"
STAMP = "bench.stamp"


def make_app(dsn: str, *, pool_size: int) -> Any:
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size)
    app = procrastinate.App(connector=connector)

    @app.task(name=NOOP)
    async def noop() -> None:
        pass

    @app.task(name=STAMP)
    async def stamp(sent_at: float) -> None:
        report_latency(sent_at)

    return app


def worker_pool_size(concurrency: int) -> int:
    # One connection per running job to write its outcome, one to fetch, one to LISTEN:
    # the pool never makes a job wait for a connection (capped for the server's sake).
    return min(concurrency + 2, 40)


class ProcrastinateSystem(System):
    name = "procrastinate"
    title = "procrastinate"
    unfinished_sql = (
        "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    )
    completed_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    tables = ("procrastinate_jobs",)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.app = make_app(dsn, pool_size=10)

    async def install(self) -> None:
        async with self.app.open_async():
            await self.app.schema_manager.apply_schema_async()

    async def open(self) -> None:
        await self.app.open_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def reset(self) -> None:
        await self.app.connector.execute_query_async(
            "TRUNCATE procrastinate_jobs, procrastinate_events RESTART IDENTITY CASCADE"
        )

    async def enqueue_bulk(self, count: int) -> None:
        await self.app.tasks[NOOP].batch_defer_async(*([{}] * count))

    async def enqueue_one(self) -> None:
        await self.app.tasks[NOOP].defer_async()

    async def enqueue_stamp(self, sent_at: float) -> None:
        await self.app.tasks[STAMP].defer_async(sent_at=sent_at)

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        return [Point(c, 1) for c in ((1, 10) if quick else (1, 10, 50, 100))]

    @staticmethod
    def default_point() -> Point:
        # procrastinate's worker runs one job at a time unless told otherwise.
        return Point(1, 1)

    def drain_jobs(self, point: Point, jobs: int) -> int:
        # One job at a time runs at a few hundred jobs/s: a quarter of the drain will do.
        return max(1_000, jobs // 4) if point.concurrency == 1 else jobs

    @staticmethod
    def latency_point() -> Point:
        return Point(10, 1)


SYSTEM = ProcrastinateSystem


async def work(options: WorkerOptions, ready: Ready) -> None:
    app = make_app(options.dsn, pool_size=worker_pool_size(options.concurrency))
    async with app.open_async():
        await ready()
        await app.run_worker_async(
            concurrency=options.concurrency,
            wait=options.mode != "drain",
        )
