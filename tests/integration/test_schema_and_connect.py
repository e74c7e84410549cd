"""Migrations, an unmigrated database, an unreachable database."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg
import pytest

import asyncq

pytestmark = pytest.mark.anyio


async def test_migrate_is_idempotent(throwaway_dsn: str) -> None:
    async with asyncq.App(throwaway_dsn) as app:
        first = await app.migrate()
        second = await app.migrate()
    assert first and first == sorted(first)
    assert second == []
    with psycopg.connect(throwaway_dsn) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM asyncq_migrations")]
        assert sorted(versions) == first
        assert conn.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (0,)


async def test_migrate_on_the_session_database_applies_nothing(app: asyncq.App) -> None:
    assert await app.migrate() == []


async def test_concurrent_migrations_on_a_fresh_database_are_safe(throwaway_dsn: str) -> None:
    results: list[list[int]] = []

    async def migrate_once() -> None:
        async with asyncq.App(throwaway_dsn, pool_min_size=0) as app:
            results.append(await app.migrate())

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(migrate_once)

    applied = [v for r in results for v in r]
    assert len(results) == 4
    assert applied and len(applied) == len(set(applied))  # each version applied exactly once
    assert sum(1 for r in results if r) == 1
    with psycopg.connect(throwaway_dsn) as conn:
        versions = sorted(r[0] for r in conn.execute("SELECT version FROM asyncq_migrations"))
        assert versions == sorted(applied)

    # The migrated schema works.
    async with asyncq.App(throwaway_dsn) as app:
        ran: list[int] = []

        @app.task
        async def job(n: int) -> None:
            ran.append(n)

        await job.defer(5)
        await app.run_worker(drain=True, handle_signals=False)
        assert ran == [5]


async def test_worker_on_an_unmigrated_database_says_to_migrate(throwaway_dsn: str) -> None:
    app = asyncq.App(throwaway_dsn)

    @app.task
    async def job() -> None:
        pass

    with pytest.raises(asyncq.SchemaNotMigrated, match="asyncq migrate"):
        await app.run_worker(drain=True, handle_signals=False)
    # run_worker opened the App itself and closed it again.
    with pytest.raises(asyncq.AppNotOpen):
        _ = app.pool


async def test_every_call_on_an_unmigrated_database_says_to_migrate(throwaway_dsn: str) -> None:
    """Defers of every kind, results and the admin calls raise `SchemaNotMigrated`, which
    names the command to run and the database, chained from psycopg's UndefinedTable (or
    UndefinedFunction, for a statement that calls one of the schema's functions)."""
    app = asyncq.App(throwaway_dsn)
    database = psycopg.conninfo.conninfo_to_dict(throwaway_dsn)["dbname"]

    @app.task(name="unmigrated.job")
    async def job(n: int) -> None:
        pass

    @app.task(name="unmigrated.sync_job")
    def sync_job(n: int) -> None:
        pass

    async def gathered() -> None:
        # Concurrent defers: the first writes alone, the others gather into one INSERT.
        ended = await asyncio.gather(*(job.defer(n) for n in range(5)), return_exceptions=True)
        assert all(isinstance(e, asyncq.SchemaNotMigrated) for e in ended), ended
        raise ended[-1]

    async def in_a_transaction() -> None:
        async with app.pool.connection() as conn, conn.transaction():
            await job.options(conn=conn).defer(1)

    async with app:
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "defer": lambda: job.defer(1),
            "defer unique": lambda: job.options(unique_key="k").defer(1),
            "defer later": lambda: job.options(delay=5).defer(1),
            "defer_many": lambda: job.defer_many([{"n": 1}, {"n": 2}]),
            "gathered defers": gathered,
            "defer in a transaction": in_a_transaction,
            "defer_sync": lambda: anyio.to_thread.run_sync(lambda: sync_job.defer_sync(1)),
            "result": lambda: app.result(1, timeout=10),
            "cancel": lambda: app.cancel(1),
            "requeue": lambda: app.requeue([1]),
            "requeue failed": lambda: app.requeue(queues=["default"]),
            "pause": lambda: app.pause("default"),
            "resume": lambda: app.resume("default"),
            "list_schedules": app.list_schedules,
        }
        for what, call in calls.items():
            with pytest.raises(asyncq.SchemaNotMigrated) as raised:
                with anyio.fail_after(10):
                    await call()
            message = str(raised.value)
            assert "`asyncq migrate MODULE:APP` (or `await app.migrate()`)" in message, what
            assert f"in database {database!r}" in message, (what, message)
            cause = raised.value.__cause__
            missing = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)
            assert isinstance(cause, missing), (what, cause)


async def test_worker_on_an_outdated_schema_says_to_migrate(throwaway_dsn: str) -> None:
    async with asyncq.App(throwaway_dsn) as app:
        await app.migrate()
        with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM asyncq_migrations")
        with pytest.raises(asyncq.SchemaNotMigrated, match="asyncq migrate"):
            await app.run_worker(drain=True, handle_signals=False)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://postgres:hunter2-Sup3rSecret@127.0.0.1:1/x",
        "host=127.0.0.1 port=1 dbname=x user=postgres password=hunter2-Sup3rSecret",
    ],
)
async def test_unreachable_database_raises_database_unavailable(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = asyncq.App(dsn, connect_timeout=2)
    with anyio.fail_after(30), pytest.raises(asyncq.DatabaseUnavailable) as info:
        await app.open()
    shown = "".join(traceback.format_exception(info.value))
    assert "127.0.0.1" in str(info.value)
    assert "hunter2" not in shown
    assert "hunter2" not in repr(info.value)
    assert "hunter2" not in caplog.text
    with pytest.raises(asyncq.AppNotOpen):
        _ = app.pool


async def test_app_not_open(dsn: str, db: Any) -> None:
    app = asyncq.App(dsn)

    @app.task
    async def job() -> None:
        pass

    with pytest.raises(asyncq.AppNotOpen):
        await job.defer()
    async with app:
        await job.defer()
    with pytest.raises(asyncq.AppNotOpen):
        await job.defer()
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (1,)
