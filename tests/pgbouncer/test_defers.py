"""Defers through PgBouncer in transaction mode: one at a time, gathered, many in one
statement, with a unique key, later, and on the caller's own connection inside its
transaction (which PgBouncer keeps on one server connection until it ends)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import asyncq
from tests.harness.pgbouncer import PgBouncer

pytestmark = pytest.mark.anyio


def job_rows(db: Any) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT id, task_name, (args->>'n')::int, status::text FROM asyncq_jobs ORDER BY id"
    ).fetchall()


@pytest.fixture
def work(app: asyncq.App) -> asyncq.Task[Any, Any]:
    @app.task(name="pgb.work")
    async def work(n: int) -> None:
        pass

    return work


async def test_single_defers(work: asyncq.Task[Any, Any], db: Any) -> None:
    ids = [await work.defer(n) for n in range(20)]  # past psycopg's prepare threshold
    assert ids == sorted(set(ids))
    assert job_rows(db) == [(i, "pgb.work", n, "queued") for n, i in enumerate(ids)]


async def test_gathered_defers(work: asyncq.Task[Any, Any], db: Any) -> None:
    ids = await asyncio.gather(*(work.defer(n) for n in range(300)))
    assert len(set(ids)) == 300
    rows = job_rows(db)
    assert {(r[0], r[2]) for r in rows} == {(i, n) for n, i in enumerate(ids)}


async def test_defer_many_unique_keys_and_later(work: asyncq.Task[Any, Any], db: Any) -> None:
    many = await work.defer_many([{"n": n} for n in range(100)])
    assert len(many) == 100
    first = await work.options(unique_key="nightly").defer(1000)
    assert await work.options(unique_key="nightly").defer(1001) == first
    later = await work.options(delay=3600).defer(2000)
    row = db.execute(
        "SELECT run_at > now() + interval '59 minutes' FROM asyncq_jobs WHERE id = %s", (later,)
    ).fetchone()
    assert row == (True,)
    assert len(job_rows(db)) == 102


async def test_defers_on_the_callers_connection_join_its_transaction(
    work: asyncq.Task[Any, Any], bouncer: PgBouncer, dsn: str, db: Any
) -> None:
    async with await psycopg.AsyncConnection.connect(
        bouncer.through(dsn), prepare_threshold=None
    ) as conn:
        async with conn.transaction():
            one = await work.options(conn=conn).defer(1)
            many = await work.options(conn=conn).defer_many([{"n": 2}, {"n": 3}])
            keyed = await work.options(conn=conn, unique_key="k").defer(4)
            assert job_rows(db) == []  # not committed yet
        assert [r[0] for r in job_rows(db)] == [one, *many, keyed]

        with pytest.raises(RuntimeError, match="roll back"):
            async with conn.transaction():
                await work.options(conn=conn).defer(5)
                await work.options(conn=conn).defer_many([{"n": 6}])
                raise RuntimeError("roll back")
        assert [r[2] for r in job_rows(db)] == [1, 2, 3, 4]
