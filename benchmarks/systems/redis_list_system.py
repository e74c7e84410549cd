"""A bare Redis list queue, the shape benchmark's reference (benchmarks/shape.py).

The "reliable queue" of the seed article (../shared/seeds/, 000): producers LPUSH a job
onto ``bench:list:queue``; each of ``concurrency`` coroutines moves one job at a time to
``bench:list:processing`` with LMOVE (BLMOVE with a 1 s timeout when serving), runs it,
then LREMs it from the processing list and INCRs a counter of done jobs: three commands
per job, as in the article. In a drain a coroutine ends when LMOVE finds the queue empty.
No retries, no leases, nothing written to disk (as this machine's Redis runs); a worker
that dies leaves its jobs in the processing list for someone to put back.

One redis-py asyncio client; its pool gives each coroutine a connection of its own.
Only the shape benchmark uses it (``--only redis``); it is not one of the throughput peers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from benchmarks import redisdb
from benchmarks.common import report_latency, until_signalled
from benchmarks.systems import Point, Ready, System, WorkerOptions

QUEUE = "bench:list:queue"
PROCESSING = "bench:list:processing"
DONE = "bench:list:done"
KEYS = ("bench:list:*",)
CHUNK = 5_000


class RedisListSystem(System):
    name = "redis"
    title = "Redis list (LMOVE loop)"
    uses_postgres = False
    unfinished_sql = ""
    completed_sql = ""
    tables = ()

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.redis: Any = None
        self.ids = itertools.count()

    async def install(self) -> None:
        await redisdb.clear(self.dsn, *KEYS)

    async def open(self) -> None:
        self.redis = redisdb.client(self.dsn)

    async def close(self) -> None:
        if self.redis is not None:
            await redisdb.clear(self.dsn, *KEYS)
            await self.redis.aclose()

    async def reset(self) -> None:
        await redisdb.clear(self.dsn, *KEYS)

    async def unfinished(self) -> bool:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.llen(QUEUE)
            pipe.llen(PROCESSING)
            waiting, running = await pipe.execute()
        return bool(waiting or running)

    async def completed(self) -> int:
        return int(await self.redis.get(DONE) or 0)

    async def close_probe(self) -> None:
        pass

    def _job(self, **fields: Any) -> str:
        return json.dumps({"id": next(self.ids), **fields})

    async def _push(self, jobs: list[str]) -> None:
        for i in range(0, len(jobs), CHUNK):
            await self.redis.lpush(QUEUE, *jobs[i : i + CHUNK])

    async def enqueue_bulk(self, count: int) -> None:
        await self._push([self._job() for _ in range(count)])

    async def enqueue_sleep_bulk(self, count: int, seconds: float) -> None:
        await self._push([self._job(seconds=seconds) for _ in range(count)])

    async def enqueue_one(self) -> None:
        await self.redis.lpush(QUEUE, self._job())

    async def enqueue_stamp(self, sent_at: float) -> None:
        await self.redis.lpush(QUEUE, self._job(sent_at=sent_at))

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        return [Point(8, 1)]

    @staticmethod
    def latency_point() -> Point:
        return Point(8, 1)


SYSTEM = RedisListSystem


async def work(options: WorkerOptions, ready: Ready) -> None:
    redis = redisdb.client(options.dsn)
    drain = options.mode == "drain"

    async def loop() -> None:
        while True:
            if drain:
                raw = await redis.lmove(QUEUE, PROCESSING, "RIGHT", "LEFT")
                if raw is None:
                    return
            else:
                raw = await redis.blmove(QUEUE, PROCESSING, 1, "RIGHT", "LEFT")
                if raw is None:
                    continue
            job = json.loads(raw)
            if "sent_at" in job:
                report_latency(job["sent_at"])
            if job.get("seconds"):
                await asyncio.sleep(job["seconds"])
            await redis.lrem(PROCESSING, 1, raw)
            await redis.incr(DONE)

    try:
        # One connection per coroutine, opened before the clock starts.
        await asyncio.gather(*(redis.ping() for _ in range(options.concurrency)))
        await ready()
        loops = [asyncio.create_task(loop()) for _ in range(options.concurrency)]
        if drain:
            await asyncio.gather(*loops)
        else:
            await until_signalled()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
    finally:
        await redis.aclose()
