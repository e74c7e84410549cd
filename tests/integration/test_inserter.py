"""Defers on the App's pool: a lone defer writes at once, concurrent ones are gathered."""

from __future__ import annotations

import os
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest

import asyncq
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio


async def test_concurrent_defers_are_written_together_and_each_gets_its_id(
    app: asyncq.App, db: Any
) -> None:
    @app.task(name="add")
    async def add(i: int) -> None:
        pass

    ids: dict[int, int] = {}

    async def defer_some(k: int) -> None:
        for n in range(20):
            value = k * 100 + n
            ids[value] = await add.defer(value)

    async with anyio.create_task_group() as tg:
        for k in range(50):
            tg.start_soon(defer_some, k)

    assert len(ids) == 1000 and len(set(ids.values())) == 1000
    rows = db.execute("SELECT id, (args->>'i')::int, xmin::text FROM asyncq_jobs").fetchall()
    assert {job_id: value for job_id, value, _ in rows} == {v: k for k, v in ids.items()}
    transactions = {xmin for _, _, xmin in rows}
    assert len(transactions) < len(rows) / 2  # gathered: many jobs per commit


async def test_a_lone_defer_is_written_at_once_in_its_own_transaction(
    app: asyncq.App, db: Any
) -> None:
    @app.task(name="one")
    async def one(i: int) -> None:
        pass

    for i in range(5):
        job_id = await one.defer(i)
        assert db.execute("SELECT 1 FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    xmins = db.execute("SELECT count(DISTINCT xmin::text) FROM asyncq_jobs").fetchone()
    assert xmins == (5,)


async def test_a_failed_write_reaches_every_caller_gathered_in_it_and_no_one_hangs(
    app: asyncq.App, db: Any
) -> None:
    db.execute(
        """
        CREATE FUNCTION refuse_13() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.args->>'i' = '13' THEN RAISE EXCEPTION 'refused 13'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_13 BEFORE INSERT ON asyncq_jobs
            FOR EACH ROW EXECUTE FUNCTION refuse_13();
        """
    )
    try:

        @app.task(name="maybe")
        async def maybe(i: int) -> None:
            pass

        results: dict[int, int | Exception] = {}

        async def defer(i: int) -> None:
            try:
                results[i] = await maybe.defer(i)
            except psycopg.Error as exc:
                results[i] = exc

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(defer, i)

        assert len(results) == 40
        assert isinstance(results[13], psycopg.errors.RaiseException)
        written = {i for i, r in results.items() if isinstance(r, int)}
        stored = {r[0] for r in db.execute("SELECT (args->>'i')::int FROM asyncq_jobs")}
        assert stored == written and 13 not in written
    finally:
        db.execute("DROP TRIGGER refuse_13 ON asyncq_jobs; DROP FUNCTION refuse_13()")


async def test_a_cancelled_defer_does_not_disturb_the_others_gathered_with_it(
    app: asyncq.App, db: Any
) -> None:
    @app.task(name="c")
    async def c(i: int) -> None:
        pass

    results: dict[int, int] = {}

    async def defer(i: int) -> None:
        results[i] = await c.defer(i)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(defer, i)
            async with anyio.create_task_group() as doomed:
                for i in range(30, 40):
                    doomed.start_soon(defer, i)
                await anyio.lowlevel.checkpoint()
                doomed.cancel_scope.cancel()

    assert set(range(30)) <= results.keys()
    stored = {r[0] for r in db.execute("SELECT (args->>'i')::int FROM asyncq_jobs")}
    assert set(range(30)) <= stored  # a cancelled defer may or may not have written its job
    assert {results[i] for i in range(30)} <= {
        r[0] for r in db.execute("SELECT id FROM asyncq_jobs")
    }


def pool_idle(app: asyncq.App) -> bool:
    stats = app.pool.get_stats()
    return stats["pool_available"] == stats["pool_size"]


def backends(db: Any, app_name: str) -> set[int]:
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app_name,)
    ).fetchall()
    return {pid for (pid,) in rows}


async def test_lone_defers_reuse_one_connection_and_close_gives_it_back(dsn: str, db: Any) -> None:
    app = asyncq.App(dsn, application_name="kept-test")
    name = f"kept-test:{os.getpid()}"

    @app.task(name="k")
    async def k(i: int) -> None:
        pass

    async with app:
        for i in range(20):
            await k.defer(i)
        writers = db.execute("SELECT count(DISTINCT xmin::text) FROM asyncq_jobs").fetchone()
        assert writers == (20,)
        stats = app.pool.get_stats()
        # One checkout for all twenty: the connection is kept between them...
        assert stats.get("requests_num", 0) <= 2, stats
        # ... and given back once it has been idle a moment, for others to use.
        await until(lambda: pool_idle(app), what="the kept connection back in the pool")
    # Closed, the pool's connections end; their server processes go a moment later.
    await until(lambda: not backends(db, name), what="the App's server processes to end")


async def test_a_kept_connection_that_died_is_replaced_and_loses_no_later_defer(
    dsn: str, db: Any
) -> None:
    app = asyncq.App(dsn, application_name="kept-dies")

    @app.task(name="d")
    async def d(i: int) -> None:
        pass

    async with app:
        await d.defer(1)
        for pid in backends(db, f"kept-dies:{os.getpid()}"):
            db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            await d.defer(2)  # the kept connection was killed under it: a clear error
        assert await d.defer(3)  # and the next defer takes a fresh one
        stored = {r[0] for r in db.execute("SELECT (args->>'i')::int FROM asyncq_jobs")}
        assert stored == {1, 3}
