"""asyncq: deferred with its public API, run by ``App.run_worker`` in a worker process.

The package is named here, not imported: the same system, given another package, runs
asyncq as it was at another commit (``--baseline``, benchmarks/systems/baseline_system.py),
and the worker processes of that one import nothing of the working tree's asyncq.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.common import (
    OWN_CONNECTION_LABEL,
    PLAIN_INSERT_LABEL,
    SAME_ROW_LABEL,
    connect,
    report_latency,
)
from benchmarks.systems import Point, Ready, System, WorkerOptions

PACKAGE = "asyncq"
NOOP = "bench.noop"
STAMP = "bench.stamp"
SLEEP = "bench.sleep"  # the shape benchmark's job: asyncio.sleep(seconds)
# The plain-SQL system's INSERT, timed in turns with asyncq's defers on the same database.
PLAIN_INSERT = "INSERT INTO asyncq_jobs (task_name, args) VALUES (%s, %s::jsonb) RETURNING id"
# The row a defer of the no-op task writes, as one INSERT with its five values.
SAME_ROW_INSERT = (
    "INSERT INTO asyncq_jobs (task_name, queue, args, priority, max_attempts)"
    " VALUES (%s, %s, %s::jsonb, %s, %s) RETURNING id"
)


# What the no-op task returns in the variant "result": a small result to store.
SMALL_RESULT = {"ok": True, "count": 3, "name": "small"}


def make_app(dsn: str, package: str = PACKAGE, *, returns: Any = None) -> Any:
    """An ``App`` of ``package`` (asyncq, or the baseline's copy) with the two bench tasks;
    the no-op task returns ``returns``."""
    app = importlib.import_module(package).App(dsn, application_name="asyncq-bench")

    @app.task(name=NOOP)
    async def noop() -> Any:
        return returns

    @app.task(name=STAMP)
    async def stamp(sent_at: float) -> None:
        report_latency(sent_at)

    @app.task(name=SLEEP)
    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)

    return app


def code_of(app: Any) -> Path:
    """The file that defines ``app``'s class: which asyncq a process really runs."""
    return Path(str(sys.modules[type(app).__module__].__file__))


class AsyncqSystem(System):
    name = "asyncq"
    title = "asyncq"
    package = PACKAGE
    unfinished_sql = (
        "SELECT EXISTS (SELECT 1 FROM asyncq_jobs WHERE status = 'queued')"
        " OR EXISTS (SELECT 1 FROM asyncq_jobs WHERE expires_at IS NOT NULL AND status = 'running')"
    )
    completed_sql = "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'"
    tables = ("asyncq_jobs",)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.app = make_app(dsn, self.package)
        self.own_conn: psycopg.AsyncConnection[Any] | None = None
        self.plain_conn: psycopg.AsyncConnection[Any] | None = None
        self.same_row_conn: psycopg.AsyncConnection[Any] | None = None

    def code(self) -> Path | None:
        return code_of(self.app).parent

    async def install(self) -> None:
        async with self.app:
            await self.app.migrate()

    async def open(self) -> None:
        await self.app.open()
        self.own_conn = await connect(self.dsn)
        self.plain_conn = await connect(self.dsn)
        self.same_row_conn = await connect(self.dsn)

    async def close(self) -> None:
        for conn in (self.own_conn, self.plain_conn, self.same_row_conn):
            if conn is not None:
                await conn.close()
        await self.app.close()

    async def reset(self) -> None:
        async with self.app.connection() as conn:
            await conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")

    async def enqueue_bulk(self, count: int) -> None:
        await self.app.tasks[NOOP].defer_many([{}] * count)

    async def enqueue_sleep_bulk(self, count: int, seconds: float) -> None:
        await self.app.tasks[SLEEP].defer_many([{"seconds": seconds}] * count)

    async def enqueue_one(self) -> None:
        await self.app.tasks[NOOP].defer()

    async def enqueue_stamp(self, sent_at: float) -> None:
        await self.app.tasks[STAMP].defer(sent_at)

    async def enqueue_on_own_connection(self) -> None:
        await self.app.tasks[NOOP].options(conn=self.own_conn).defer()

    def extra_enqueue(self) -> dict[str, Any]:
        async def plain_insert() -> None:
            assert self.plain_conn is not None
            await (await self.plain_conn.execute(PLAIN_INSERT, (NOOP, "{}"))).fetchone()

        noop = self.app.tasks[NOOP]
        same_row = (NOOP, noop.queue, "{}", 0, noop.max_attempts)

        async def same_row_insert() -> None:
            assert self.same_row_conn is not None
            await (await self.same_row_conn.execute(SAME_ROW_INSERT, same_row)).fetchone()

        return {
            OWN_CONNECTION_LABEL: self.enqueue_on_own_connection,
            PLAIN_INSERT_LABEL: plain_insert,
            SAME_ROW_LABEL: same_row_insert,
        }

    def in_turns(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {
            "one_by_one": self.enqueue_one,
            OWN_CONNECTION_LABEL: self.enqueue_on_own_connection,
        }

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        # Concurrency above the batch size lets the next claim go out while a batch runs.
        # b=default: run_worker()'s own batch size (the concurrency plus the prefetch, at
        # most 100), as a user who sets only the concurrency gets it.
        if quick:
            return [Point(10, 0), Point(10, 10), Point(100, 100), Point(200, 100)]
        points = [Point(c, b) for c in (10, 50, 100, 200) for b in (10, 50, 100) if b <= c]
        return [Point(10, 0), *points]

    @staticmethod
    def default_point() -> Point:
        # run_worker()'s defaults: concurrency 10 and its own batch size.
        return Point(10, 0)

    @staticmethod
    def latency_point() -> Point:
        return Point(10, 0)


SYSTEM = AsyncqSystem


async def serve(package: str, options: WorkerOptions, ready: Ready) -> None:
    """Run a worker of ``package``'s App; say which code it runs (``CODE <file>`` on stdout).
    In the variant ``result`` its no-op task returns a small dict."""
    returns = SMALL_RESULT if options.variant == "result" else None
    app = make_app(options.dsn, package, returns=returns)
    print(f"CODE {code_of(app)}", flush=True)
    if package != PACKAGE:
        mixed = sorted(m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + "."))
        if mixed:
            raise RuntimeError(f"{package} imported the working tree's asyncq: {mixed}")
    async with app:
        await ready()
        await app.run_worker(
            concurrency=options.concurrency,
            batch_size=options.batch or None,
            drain=options.mode == "drain",
        )


async def work(options: WorkerOptions, ready: Ready) -> None:
    await serve(PACKAGE, options, ready)
