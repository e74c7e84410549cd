"""The group reaches the jobs table by every way of deferring; the limited claim skips
paused queues and the queues a worker does not serve, and runs unlimited jobs beside
limited ones."""

from __future__ import annotations

from typing import Any

import pytest

import asyncq
from tests.integration.conftest import Drain

pytestmark = pytest.mark.anyio


async def test_every_defer_stores_the_group(app: asyncq.App, db: Any, aconn: Any) -> None:
    @app.task(group_concurrency=1)
    async def grouped(n: int = 0) -> None:
        pass

    # A group on a task without group_concurrency is stored too: the limit is the
    # workers' to apply, and a later declaration may add it.
    @app.task
    async def plain(n: int = 0) -> None:
        pass

    ids = {
        await grouped.options(group="gathered").defer(n=1): "gathered",
        await grouped.options(group="later", delay=60).defer(n=2): "later",
        await grouped.options(group="unique", unique_key="k").defer(n=3): "unique",
        await grouped.options(group="on conn", conn=aconn).defer(n=4): "on conn",
        await plain.options(group="plain").defer(n=5): "plain",
    }
    for job_id in await grouped.options(group="many").defer_many([{"n": 6}, {"n": 7}]):
        ids[job_id] = "many"
    ids[await grouped.defer(n=8)] = None  # type: ignore[assignment]

    rows = dict(db.execute("SELECT id, group_key FROM asyncq_jobs").fetchall())
    assert rows == ids


async def test_limited_claim_skips_paused_and_unserved_queues(
    app: asyncq.App, db: Any, drain: Drain
) -> None:
    @app.task(concurrency=2, queue="limited")
    async def capped(n: int = 0) -> None:
        pass

    @app.task(rate_limit="1000/s", queue="paused")
    async def rated(n: int = 0) -> None:
        pass

    @app.task(queue="other")
    async def elsewhere(n: int = 0) -> None:
        pass

    @app.task
    async def free(n: int = 0) -> None:
        pass

    db.execute(
        "INSERT INTO asyncq_queues (name, paused_at) VALUES ('paused', now())"
        " ON CONFLICT (name) DO UPDATE SET paused_at = now()"
    )
    try:
        await capped.defer_many([{"n": n} for n in range(5)])
        await rated.defer_many([{"n": n} for n in range(5)])
        await elsewhere.defer_many([{"n": n} for n in range(5)])
        await free.defer_many([{"n": n} for n in range(5)])
        stats = await drain(queues=["limited", "paused", "default"])
    finally:
        db.execute("DELETE FROM asyncq_queues WHERE name = 'paused'")
    rows = db.execute(
        "SELECT queue, status::text, count(*) FROM asyncq_jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    assert rows == [
        ("default", "done", 5),
        ("limited", "done", 5),
        ("other", "queued", 5),
        ("paused", "queued", 5),
    ]
    assert stats.done == 10
