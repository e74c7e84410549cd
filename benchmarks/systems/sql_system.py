"""The plain-SQL ceiling: psycopg and hand-written SQL on asyncq's own table.

The table, its indexes and its wake-up trigger come from asyncq's migration, and
the claim is asyncq's own claim statement (CTE, ``FOR NO KEY UPDATE SKIP LOCKED``,
``UPDATE ... RETURNING``). Around it there is nothing but the minimum: no leases
renewed, no outcome fencing, no retries, no bookkeeping.

Worker variants: ``batched`` marks each claimed batch done with one UPDATE;
``per-job`` with one UPDATE per job. In ``serve`` mode (pickup latency) one
coroutine LISTENs and claims up to ``batch`` jobs per wake-up; with the variant
``batched`` (the start states' idle workers, benchmarks/starts.py) each of the
``concurrency`` connections runs the batched loop and, when a claim finds nothing,
LISTENs until the next notification.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

from asyncq import App
from asyncq.store import QUERIES
from benchmarks.common import connect, report_latency
from benchmarks.systems import Point, Ready, System, WorkerOptions

NOOP = "bench.noop"
STAMP = "bench.stamp"
CLAIM = QUERIES["claim_any"]
INSERT = "INSERT INTO asyncq_jobs (task_name, args) VALUES (%s, %s::jsonb) RETURNING id"
INSERT_MANY = (
    "INSERT INTO asyncq_jobs (task_name, args)"
    " SELECT %s, a FROM jsonb_array_elements(%s::jsonb) AS a RETURNING id"
)
DONE_MANY = (
    "UPDATE asyncq_jobs SET status = 'done', finished_at = now(), expires_at = NULL"
    " WHERE id = ANY(%s::bigint[])"
)
DONE_ONE = (
    "UPDATE asyncq_jobs SET status = 'done', finished_at = now(), expires_at = NULL WHERE id = %s"
)
LEASE = timedelta(seconds=30)


class SqlSystem(System):
    name = "sql"
    title = "plain SQL"
    unfinished_sql = (
        "SELECT EXISTS (SELECT 1 FROM asyncq_jobs WHERE status = 'queued')"
        " OR EXISTS (SELECT 1 FROM asyncq_jobs WHERE expires_at IS NOT NULL AND status = 'running')"
    )
    completed_sql = "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'"
    tables = ("asyncq_jobs",)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conn: Any = None
        self.pool: AsyncConnectionPool | None = None

    async def install(self) -> None:
        async with App(self.dsn) as app:
            await app.migrate()

    async def open(self) -> None:
        self.conn = await connect(self.dsn)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")

    async def enqueue_bulk(self, count: int) -> None:
        cur = await self.conn.execute(INSERT_MANY, (NOOP, json.dumps([{}] * count)))
        await cur.fetchall()

    async def enqueue_one(self) -> None:
        await (await self.conn.execute(INSERT, (NOOP, "{}"))).fetchone()

    async def enqueue_stamp(self, sent_at: float) -> None:
        await self.conn.execute(INSERT, (STAMP, json.dumps({"sent_at": sent_at})))

    async def enqueue_concurrent_setup(self, coroutines: int) -> None:
        self.pool = AsyncConnectionPool(
            self.dsn, min_size=10, max_size=10, kwargs={"autocommit": True}, open=False
        )
        await self.pool.open(wait=True)

    async def enqueue_concurrent_one(self) -> None:
        assert self.pool is not None
        async with self.pool.connection() as conn:
            await (await conn.execute(INSERT, (NOOP, "{}"))).fetchone()

    async def enqueue_concurrent_teardown(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        batches = (10, 100) if quick else (10, 50, 100)
        points = [Point(10, b, variant="batched") for b in batches]
        points += [Point(10, b, variant="per-job") for b in ((100,) if quick else batches)]
        return points

    @staticmethod
    def latency_point() -> Point:
        return Point(1, 10, variant="listen")


SYSTEM = SqlSystem


async def noop() -> None:
    pass


async def run_job(task_name: str, args_text: str) -> None:
    args = json.loads(args_text)  # the claim returns the arguments as JSON text
    if task_name == STAMP:
        report_latency(args["sent_at"])
    else:
        await noop()


async def claim(conn: Any, worker: str, limit: int) -> list[tuple[Any, ...]]:
    params = {"worker": worker, "limit": limit, "lease": LEASE, "skip": None}
    cur = await conn.execute(CLAIM, params)
    return list(await cur.fetchall())


async def drain_loop(conn: Any, worker: str, batch: int, per_job: bool) -> None:
    while jobs := await claim(conn, worker, batch):
        for job in jobs:
            await run_job(job[1], job[3])
            if per_job:
                await conn.execute(DONE_ONE, (job[0],))
        if not per_job:
            await conn.execute(DONE_MANY, ([job[0] for job in jobs],))


async def listen_loop(listener: Any, conn: Any, worker: str, batch: int) -> None:
    while True:
        while jobs := await claim(conn, worker, batch):
            for job in jobs:
                await run_job(job[1], job[3])
            await conn.execute(DONE_MANY, ([job[0] for job in jobs],))
        async for _ in listener.notifies(timeout=1.0, stop_after=1):
            pass


async def serve_loop(conn: Any, worker: str, batch: int) -> None:
    await conn.execute('LISTEN "asyncq.public"')
    while True:
        await drain_loop(conn, worker, batch, per_job=False)
        async for _ in conn.notifies(timeout=1.0, stop_after=1):
            pass


async def work(options: WorkerOptions, ready: Ready) -> None:
    worker = f"sql:{os.getpid()}"
    if options.mode == "serve" and options.variant == "batched":
        conns = [await connect(options.dsn) for _ in range(options.concurrency)]
        try:
            await ready()
            await asyncio.gather(*(serve_loop(c, worker, options.batch) for c in conns))
        finally:
            for conn in conns:
                await conn.close()
        return
    if options.mode == "serve":
        async with await connect(options.dsn) as listener, await connect(options.dsn) as conn:
            await listener.execute('LISTEN "asyncq.public"')
            await ready()
            await listen_loop(listener, conn, worker, options.batch)
        return
    per_job = options.variant == "per-job"
    conns = [await connect(options.dsn) for _ in range(options.concurrency)]
    try:
        await ready()
        await asyncio.gather(*(drain_loop(c, worker, options.batch, per_job) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
