"""saq with its PostgreSQL backend (``saq[postgres]``): ``PostgresQueue`` and saq's ``Worker``.

The queue's pool is saq's own (psycopg, ``min_size`` 4, ``max_size`` 20). Each of the
worker's ``concurrency`` coroutines asks for one job; a dequeue claims as many jobs as
coroutines are waiting (``FOR UPDATE SKIP LOCKED``), and each job is then written again
as it starts and as it finishes. Idle coroutines wait on LISTEN/NOTIFY (saq's default,
``poll_interval=0``). ``mode=drain`` is saq's ``burst`` (a coroutine that finds no job
within ``dequeue_timeout``, 1 s here, ends the run once the others are done). saq has no
batch enqueue: its pre-loads are ``Queue.enqueue`` calls, 50 at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from benchmarks.common import report_latency
from benchmarks.systems import Point, Ready, System, WorkerOptions

QUEUE = "default"
GATHER = 50  # enqueue calls in flight at once when pre-loading


async def noop(ctx: dict[str, Any]) -> None:
    pass


async def stamp(ctx: dict[str, Any], *, sent_at: float) -> None:
    report_latency(sent_at)


async def sleep_for(ctx: dict[str, Any], *, seconds: float) -> None:
    await asyncio.sleep(seconds)


def make_queue(dsn: str) -> Any:
    from saq.queue.postgres import PostgresQueue

    return PostgresQueue.from_url(dsn, name=QUEUE)


async def gathered(calls: int, call: Any) -> None:
    gate = asyncio.Semaphore(GATHER)

    async def one() -> None:
        async with gate:
            await call()

    await asyncio.gather(*(one() for _ in range(calls)))


class SaqSystem(System):
    name = "saq"
    title = "saq (PostgreSQL)"
    bulk_note = "no batch API"
    unfinished_sql = "SELECT EXISTS (SELECT 1 FROM saq_jobs WHERE status IN ('queued', 'active'))"
    completed_sql = "SELECT count(*) FROM saq_jobs WHERE status = 'complete'"
    tables = ("saq_jobs",)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.queue: Any = None

    async def install(self) -> None:
        queue = make_queue(self.dsn)
        await queue.connect()  # creates saq's tables
        await queue.disconnect()

    async def open(self) -> None:
        self.queue = make_queue(self.dsn)
        await self.queue.connect()

    async def close(self) -> None:
        if self.queue is not None:
            await self.queue.disconnect()

    async def reset(self) -> None:
        async with self.queue.pool.connection() as conn:
            await conn.execute("TRUNCATE saq_jobs, saq_stats")

    async def enqueue_bulk(self, count: int) -> None:
        await gathered(count, self.enqueue_one)

    async def enqueue_sleep_bulk(self, count: int, seconds: float) -> None:
        await gathered(count, lambda: self.queue.enqueue("sleep_for", seconds=seconds))

    async def enqueue_one(self) -> None:
        await self.queue.enqueue("noop")

    async def enqueue_stamp(self, sent_at: float) -> None:
        await self.queue.enqueue("stamp", sent_at=sent_at)

    def drain_jobs(self, point: Point, jobs: int) -> int:
        # A few hundred jobs/s: half the drain is enough for a rate.
        return max(1_000, jobs // 2)

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        return [Point(c, 1) for c in ((10, 50) if quick else (10, 20, 50))]

    @staticmethod
    def default_point() -> Point:
        return Point(10, 1)

    @staticmethod
    def latency_point() -> Point:
        return Point(10, 1)


SYSTEM = SaqSystem


async def work(options: WorkerOptions, ready: Ready) -> None:
    from saq import Worker

    queue = make_queue(options.dsn)
    await queue.connect()
    drain = options.mode == "drain"
    worker = Worker(
        queue,
        functions=[noop, stamp, sleep_for],
        concurrency=options.concurrency,
        burst=drain,
        dequeue_timeout=1.0 if drain else 0.0,
    )
    try:
        await ready()
        await worker.start()  # until burst ends or SIGTERM
    finally:
        await queue.disconnect()
