"""Migrations, an unmigrated database, an unreachable database."""

from __future__ import annotations

import logging
import traceback
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
