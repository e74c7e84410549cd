"""Tasks that use the App's pool never starve the worker, nor each other's defers."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

import asyncq

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
