"""Every running worker has a row in asyncq_workers (migration 0020): written as it starts,
refreshed with the jobs it runs, deleted as it stops; a row not refreshed for three beats
is a dead worker's, and the maintenance deletes it later."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq import pools
from asyncq.worker.maintenance import workers as dead_workers
from asyncq.worker.observer import Observer
from tests.harness.waiting import WITHIN

pytestmark = pytest.mark.anyio


async def listed_until(app: asyncq.App, wanted: Any, what: str) -> list[Any]:
    """The workers listed, once ``wanted`` of them is true (polled; fails after a while)."""
    with anyio.fail_after(WITHIN):
        while not wanted(found := await app.workers()):  # noqa: ASYNC110 - rows of the database
            await anyio.sleep(0.01)
    return found


class SeesWorkers(Observer):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def workers(self, live: int, dead: int) -> None:
        self.seen.append((live, dead))


async def test_a_worker_is_listed_as_it_starts_and_unlisted_as_it_stops(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    app.import_path = "shop.jobs:app"
    # No refresh comes in this test: the row is the one written at the start.
    worker = asyncio.create_task(
        app.run_worker(
            ["default", "other"], concurrency=3, handle_signals=False, presence_interval=3600
        )
    )
    try:
        [listed] = await listed_until(app, bool, "the worker's row")
        assert (listed.host, listed.pid, listed.version) == (
            socket.gethostname(),
            os.getpid(),
            asyncq.__version__,
        )
        assert (listed.app, listed.queues, listed.concurrency) == (
            "shop.jobs:app",
            ["default", "other"],
            3,
        )
        assert listed.alive and listed.beat_seconds == 3600 and listed.running == 0
        assert listed.id.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    finally:
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker
    assert await app.workers() == []
    assert db.execute("SELECT count(*) FROM asyncq_workers").fetchone() == (0,)


async def test_a_worker_s_row_says_how_many_jobs_it_runs(app: asyncq.App) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    @app.task(name="workers.busy")
    async def busy() -> None:
        started.set()
        await release.wait()

    seer = SeesWorkers()
    app._observers.append(seer)
    worker = asyncio.create_task(app.run_worker(handle_signals=False, presence_interval=0.05))
    try:
        await listed_until(app, bool, "the worker's row")
        await busy.defer()
        await started.wait()
        await listed_until(
            app, lambda found: [w.running for w in found] == [1], "the row to say one runs"
        )
        assert (1, 0) in seer.seen  # the metric's count: this worker live, none dead
    finally:
        release.set()
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker


async def test_a_worker_that_stopped_refreshing_its_row_is_dead_and_deleted_later(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    db.execute(
        "INSERT INTO asyncq_workers (id, host, pid, version, concurrency, beat, seen_at)"
        " VALUES ('live:1:a', 'h1', 1, '0.1.0', 10, '5 s', now()),"
        "        ('dead:2:b', 'h2', 2, '0.1.0', 10, '5 s', now() - interval '16 s'),"
        "        ('gone:3:c', 'h3', 3, '0.1.0', 10, '5 s', now() - interval '61 min')"
    )
    listed = await app.workers()
    assert [(w.id, w.alive) for w in listed] == [
        ("live:1:a", True),
        ("dead:2:b", False),
        ("gone:3:c", False),
    ]
    assert 15 < listed[1].seen_seconds_ago < 3600 < listed[2].seen_seconds_ago

    pruner = dead_workers.DeadWorkers(store=app.store, interval=60)
    async with pools.connection(app.pool) as conn, conn.transaction():
        assert await pruner.run(conn) is False
    assert [w.id for w in await app.workers()] == ["live:1:a", "dead:2:b"]


async def test_the_maintenance_skips_the_table_when_the_role_may_not_write_it(
    app: asyncq.App, db: psycopg.Connection[Any], dsn: str
) -> None:
    role = f"asyncq_no_workers_{os.getpid()}"
    db.execute(f"DROP ROLE IF EXISTS {role}")
    db.execute(f"CREATE ROLE {role}")
    try:
        db.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        pruner = dead_workers.DeadWorkers(store=app.store, interval=60)
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
            conn.transaction(),
        ):
            await conn.execute(f"SET LOCAL ROLE {role}")
            assert await pruner.run(conn) is False
            # The gate's transaction goes on.
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
        assert pruner.refused
    finally:
        db.execute(f"REVOKE ALL ON SCHEMA public FROM {role}")
        db.execute(f"DROP ROLE {role}")
