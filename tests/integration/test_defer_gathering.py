"""Defers gathered into one INSERT: one caller's cancellation or bad input never costs
another caller its job."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio


def waiting_inserts(db: Any) -> int:
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        "   AND query LIKE 'INSERT INTO asyncq_jobs%%'"
    ).fetchone()
    return int(row[0])


class Blocked:
    """Holds a SHARE lock on the jobs table (as a CREATE INDEX would): INSERTs wait."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], db: Any) -> None:
        self.conn = conn
        self.db = db

    async def __aenter__(self) -> Blocked:
        await self.conn.execute("BEGIN")
        await self.conn.execute("LOCK TABLE asyncq_jobs IN SHARE MODE")
        return self

    async def until_waiting(self, n: int = 1) -> None:
        await until(lambda: waiting_inserts(self.db) >= n, what=f"{n} INSERTs to wait")

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.execute("COMMIT")


async def test_a_natively_cancelled_defer_strands_no_other_caller(
    app: asyncq.App, db: Any, aconn: psycopg.AsyncConnection[Any]
) -> None:
    @app.task(name="gathering.noop")
    async def noop(n: int) -> None:
        pass

    async with Blocked(aconn, db) as blocked:
        first = asyncio.ensure_future(noop.defer(0))  # written at once: it waits for the lock
        await blocked.until_waiting()
        # These two gather behind it; the first of them leads their write.
        leader = asyncio.ensure_future(noop.defer(1))
        follower = asyncio.ensure_future(noop.defer(2))
        await asyncio.sleep(0.05)  # they gather at their first turn: no I/O before it
        leader.cancel()  # asyncio's own cancellation, as asyncio.wait_for or a server would
        await asyncio.sleep(0.05)
    with anyio.fail_after(10):
        first_id = await first
        follower_id = await follower
        later_id = await noop.defer(3)
    written = {
        row[0]: row[1]
        for row in db.execute("SELECT id, (args->>'n')::int FROM asyncq_jobs").fetchall()
    }
    assert written[first_id] == 0 and written[follower_id] == 2 and written[later_id] == 3


async def test_one_bad_defer_does_not_fail_the_others_gathered_with_it(
    app: asyncq.App, db: Any, aconn: psycopg.AsyncConnection[Any]
) -> None:
    @app.task(name="gathering.takes")
    async def takes(n: int, text: str = "") -> None:
        pass

    async def bad_max_attempts() -> int:
        return await takes.options(max_attempts=2**31).defer(100)

    async def bad_delay() -> int:
        return await takes.options(delay=1e300).defer(101)

    async with Blocked(aconn, db) as blocked:
        first = asyncio.ensure_future(takes.defer(-1))
        await blocked.until_waiting()
        good = [asyncio.ensure_future(takes.defer(n)) for n in range(5)]
        bad = [
            asyncio.ensure_future(bad_max_attempts()),
            asyncio.ensure_future(bad_delay()),
            asyncio.ensure_future(takes.defer(102, text="lone \ud800 surrogate")),
        ]
        good += [asyncio.ensure_future(takes.defer(n)) for n in range(5, 10)]
        await asyncio.sleep(0.05)
    with anyio.fail_after(10):
        results = await asyncio.gather(first, *good, *bad, return_exceptions=True)
    ids, errors = results[: 1 + len(good)], results[1 + len(good) :]
    assert all(isinstance(i, int) for i in ids), ids
    # Each bad call is refused by itself, before anything is written.
    assert isinstance(errors[0], ValueError) and "max_attempts" in str(errors[0])
    assert isinstance(errors[1], ValueError) and "delay" in str(errors[1])
    assert isinstance(errors[2], asyncq.ArgumentsError) and "surrogate" in str(errors[2])
    stored = sorted(row[0] for row in db.execute("SELECT (args->>'n')::int FROM asyncq_jobs"))
    assert stored == list(range(-1, 10))


async def test_a_gathered_write_the_database_refuses_fails_only_the_bad_caller(
    app: asyncq.App, db: Any, aconn: psycopg.AsyncConnection[Any]
) -> None:
    @app.task(name="gathering.takes_n")
    async def takes_n(n: int) -> None:
        pass

    db.execute(
        "ALTER TABLE asyncq_jobs ADD CONSTRAINT gathering_refused CHECK (args->>'n' <> '13')"
    )
    try:
        async with Blocked(aconn, db) as blocked:
            first = asyncio.ensure_future(takes_n.defer(0))
            await blocked.until_waiting()
            gathered = [asyncio.ensure_future(takes_n.defer(n)) for n in range(10, 20)]
            await asyncio.sleep(0.05)
        with anyio.fail_after(10):
            results = await asyncio.gather(first, *gathered, return_exceptions=True)
    finally:
        db.execute("ALTER TABLE asyncq_jobs DROP CONSTRAINT gathering_refused")
    refused = results[1 + 3]
    assert isinstance(refused, psycopg.errors.CheckViolation), results
    assert all(isinstance(r, int) for i, r in enumerate(results) if i != 4), results
    stored = sorted(row[0] for row in db.execute("SELECT (args->>'n')::int FROM asyncq_jobs"))
    assert stored == [0, 10, 11, 12, 14, 15, 16, 17, 18, 19]
