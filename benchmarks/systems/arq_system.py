"""arq on Redis: ``ArqRedis.enqueue_job`` and arq's ``Worker`` with ``max_jobs``.

Not a PostgreSQL queue, and its durability differs: the jobs are Redis keys and a sorted
set, kept in memory, and what a Redis restart keeps depends on the server's ``save`` and
``appendonly`` (the report prints them; the Redis of this machine has both off, so a
restart loses every queued job). It runs on a Redis database of its own
(benchmarks/redisdb.py), whose ``arq:*`` keys it deletes at each reset.

arq's worker polls: every ``poll_delay`` (0.5 s by default) it reads up to
``queue_read_limit`` job ids (``max(5 * max_jobs, 100)``) and starts them as ``max_jobs``
slots allow, each in a transaction of its own (WATCH, MULTI, an in-progress key). The
sweep shows arq at its default poll and at 10 ms (variant ``poll=10ms``), with
``max_jobs`` as the concurrency. ``mode=drain`` is arq's ``burst``. arq has no batch
enqueue: its pre-loads are ``enqueue_job`` calls, 50 at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from benchmarks import redisdb
from benchmarks.common import report_latency, until_signalled
from benchmarks.systems import Point, Ready, System, WorkerOptions

NOOP = "noop"
STAMP = "stamp"
SLEEP = "sleep_for"
QUEUE = "arq:queue"  # arq's default queue name
KEYS = ("arq:*",)
GATHER = 50  # enqueue_job calls in flight at once when pre-loading
DEFAULT_POLL = 0.5
VARIANTS = {"": DEFAULT_POLL, "poll=10ms": 0.01}


async def noop(ctx: dict[str, Any]) -> None:
    pass


async def stamp(ctx: dict[str, Any], sent_at: float) -> None:
    report_latency(sent_at)


async def sleep_for(ctx: dict[str, Any], seconds: float) -> None:
    await asyncio.sleep(seconds)


async def make_pool(url: str) -> Any:
    from arq.connections import RedisSettings, create_pool

    return await create_pool(RedisSettings.from_dsn(url))


async def gathered(calls: int, call: Any) -> None:
    """``calls`` calls of ``call()``, at most `GATHER` at a time."""
    gate = asyncio.Semaphore(GATHER)

    async def one() -> None:
        async with gate:
            await call()

    await asyncio.gather(*(one() for _ in range(calls)))


class ArqSystem(System):
    name = "arq"
    title = "arq (Redis)"
    uses_postgres = False
    bulk_note = "no batch API"
    unfinished_sql = ""
    completed_sql = ""
    tables = ()

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.pool: Any = None

    async def install(self) -> None:
        await redisdb.clear(self.dsn, *KEYS)

    async def open(self) -> None:
        self.pool = await make_pool(self.dsn)

    async def close(self) -> None:
        if self.pool is not None:
            await redisdb.clear(self.dsn, *KEYS)
            await self.pool.aclose()

    async def reset(self) -> None:
        await redisdb.clear(self.dsn, *KEYS)

    async def unfinished(self) -> bool:
        # A job leaves the queue's sorted set when it finishes (arq's finish_job).
        return bool(await self.pool.zcard(QUEUE))

    async def completed(self) -> int:
        from arq.jobs import deserialize_result

        count = 0
        keys = [key async for key in self.pool.scan_iter(match="arq:result:*", count=1000)]
        for i in range(0, len(keys), 1000):
            for raw in await self.pool.mget(keys[i : i + 1000]):
                if raw is not None and deserialize_result(raw).success:
                    count += 1
        return count

    async def close_probe(self) -> None:
        pass

    async def enqueue_bulk(self, count: int) -> None:
        await gathered(count, self.enqueue_one)

    async def enqueue_sleep_bulk(self, count: int, seconds: float) -> None:
        await gathered(count, lambda: self.pool.enqueue_job(SLEEP, seconds))

    async def enqueue_one(self) -> None:
        await self.pool.enqueue_job(NOOP)

    async def enqueue_stamp(self, sent_at: float) -> None:
        await self.pool.enqueue_job(STAMP, sent_at)

    def drain_jobs(self, point: Point, jobs: int) -> int:
        # At its default poll arq starts at most queue_read_limit jobs every 0.5 s.
        return jobs if point.variant else min(jobs, 2_000)

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        tuned = (10, 100) if quick else (10, 50, 100, 200)
        return [Point(10, 1)] + [Point(c, 1, variant="poll=10ms") for c in tuned]

    @staticmethod
    def default_point() -> Point:
        return Point(10, 1)

    @staticmethod
    def latency_point() -> Point:
        return Point(10, 1)

    def latency_gap(self, point: Point) -> tuple[float, float]:
        poll = VARIANTS[point.variant]
        return (0.010, 0.010 + poll) if poll > 0.02 else (0.010, 0.020)

    def latency_points(self) -> list[Point]:
        return [Point(10, 1), Point(10, 1, variant="poll=10ms")]


SYSTEM = ArqSystem


async def work(options: WorkerOptions, ready: Ready) -> None:
    from arq.worker import Worker

    pool = await make_pool(options.dsn)
    worker = Worker(
        functions=[noop, stamp, sleep_for],
        redis_pool=pool,
        burst=options.mode == "drain",
        max_jobs=options.concurrency,
        poll_delay=VARIANTS[options.variant],
        handle_signals=False,
    )
    await ready()
    if options.mode == "drain":
        await worker.main()
        await worker.close()
        return
    main = asyncio.create_task(worker.main())
    await until_signalled()
    main.cancel()
    # Without arq's own signal handlers close() cancels the job tasks still running and
    # gathers them, which raises their CancelledError here.
    with contextlib.suppress(asyncio.CancelledError):
        await worker.close()
