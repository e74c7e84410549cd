"""Tasks that use the App's pool never starve the worker, nor each other's defers."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import anyio
import pytest

import asyncq
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio


async def test_tasks_that_hold_a_connection_and_defer_all_run(dsn: str, db: Any) -> None:
    # The App's defaults: a pool of 10, a worker of concurrency 10. A short connect
    # timeout makes a starved pool fail fast instead of in ten seconds.
    app = asyncq.App(dsn, connect_timeout=2)
    holding = 0
    all_holding = asyncio.Event()

    @app.task(name="pool.child")
    async def child(n: int) -> None:
        pass

    @app.task(name="pool.parent", max_attempts=1)
    async def parent(n: int) -> None:
        nonlocal holding
        async with app.pool.connection() as conn:
            await conn.execute("SELECT 1")
            holding += 1
            if holding == 10:
                all_holding.set()
            with anyio.fail_after(10):
                await all_holding.wait()  # every one of the ten holds a connection now
            await child.defer(n)

    async with app:
        await parent.defer_many([{"n": n} for n in range(10)])
        with anyio.fail_after(60):
            await app.run_worker(concurrency=10, drain=True, handle_signals=False)
    statuses = db.execute(
        "SELECT task_name, status::text, count(*), max(last_error) FROM asyncq_jobs"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    assert statuses == [("pool.child", "done", 10, None), ("pool.parent", "done", 10, None)]


async def test_a_dead_idle_connection_of_the_apps_pool_is_replaced(dsn: str, db: Any) -> None:
    # The worker never uses the App's pool itself; after a server restart (here: its
    # one idle connection terminated) the pool check finds the dead one before a task does.
    app = asyncq.App(dsn, application_name="poolcheck")
    name = f"poolcheck:{os.getpid()}"
    ran = asyncio.Event()

    @app.task(name="pool.ran")
    async def mark() -> None:
        ran.set()

    def pool_idle() -> bool:
        stats = app.pool.get_stats()
        return stats["pool_available"] == stats["pool_size"]

    def app_pool_backends() -> set[int]:
        rows = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchall()
        return {row[0] for row in rows}

    async with app, anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run_worker(handle_signals=False))
        await mark.defer()
        with anyio.fail_after(10):
            await ran.wait()  # the worker is up
        await until(pool_idle, what="the defer's connection back in the pool, idle")
        before = app_pool_backends()
        assert before
        for pid in before:
            db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with anyio.fail_after(20):
            while not (after := app_pool_backends()) or after & before:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
