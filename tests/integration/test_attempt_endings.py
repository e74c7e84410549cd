"""How an attempt can end badly without harming any other job or the worker: a task that
raises CancelledError itself, arguments Python cannot decode, an outcome the database
refuses to store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import asyncq

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)


def insert(db: Any, task_name: str, args: str, **columns: Any) -> int:
    names = ["task_name", "args", *columns]
    row = db.execute(
        f"INSERT INTO asyncq_jobs ({', '.join(names)})"
        f" VALUES ({', '.join(['%s'] * len(names))}) RETURNING id",
        [task_name, args, *columns.values()],
    ).fetchone()
    return int(row[0])


def state(db: Any, job_id: int) -> tuple[str, int, str | None]:
    row = db.execute(
        "SELECT status::text, attempts, last_error FROM asyncq_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return (row[0], row[1], row[2])


async def test_a_task_raising_cancelled_error_fails_that_attempt_like_any_error(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    finished: list[str] = []

    @app.task(name="endings.cancels_itself", max_attempts=1)
    async def cancels_itself() -> None:
        raise asyncio.CancelledError()

    @app.task(name="endings.gathers_a_cancelled_child", max_attempts=1)
    async def gathers_a_cancelled_child() -> None:
        child = asyncio.ensure_future(asyncio.sleep(10))
        asyncio.get_running_loop().call_soon(child.cancel)
        await asyncio.gather(child)

    @app.task(name="endings.slow", max_attempts=1)
    async def slow() -> None:
        await asyncio.sleep(0.5)
        finished.append("slow")

    slow_id = await slow.defer()
    itself = await cancels_itself.defer()
    child = await gathers_a_cancelled_child.defer()
    after = await slow.defer()

    stats = await drain(concurrency=2)

    # The other jobs ran to their end, untouched: no grace cut short, nothing handed back.
    assert state(db, slow_id)[:2] == ("done", 1)
    assert state(db, after)[:2] == ("done", 1)
    assert finished == ["slow", "slow"]
    for job_id in (itself, child):
        status, attempts, last_error = state(db, job_id)
        assert (status, attempts) == ("failed", 1), last_error
        assert last_error is not None and "CancelledError" in last_error.splitlines()[0]
    assert (stats.done, stats.failed_attempts, stats.released) == (2, 2, 0)


async def test_arguments_python_cannot_decode_fail_only_their_own_job(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    ran: list[Any] = []

    @app.task(name="endings.takes_x")
    async def takes_x(x: Any = None) -> None:
        ran.append(x)

    # PostgreSQL stores 1e5000 as a 5001-digit number, and nests JSON far deeper than
    # Python's json module can read back.
    huge = insert(db, "endings.takes_x", '{"x": 1e5000}')
    deep = insert(db, "endings.takes_x", '{"x": ' + "[" * 5000 + "]" * 5000 + "}")
    good = [await takes_x.defer(x=n) for n in range(3)]

    stats = await drain(concurrency=10)

    assert sorted(ran) == [0, 1, 2]
    for job_id in good:
        assert state(db, job_id)[:2] == ("done", 1)
    status, attempts, last_error = state(db, huge)
    assert (status, attempts) == ("failed", 1)
    assert last_error is not None and "cannot be decoded" in last_error
    assert "digits" in last_error
    status, attempts, last_error = state(db, deep)
    assert (status, attempts) == ("failed", 1)
    assert last_error is not None and "cannot be decoded" in last_error
    assert "nested too deeply" in last_error
    assert stats.done == 3


async def test_an_outcome_the_database_refuses_costs_only_its_own_job(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    # A rule of the database's own that the outcome of one job breaks: its write is
    # refused for good, whatever the worker does.
    db.execute(
        "ALTER TABLE asyncq_jobs ADD CONSTRAINT endings_refused"
        " CHECK (last_error IS NULL OR last_error NOT LIKE '%%refuse me%%')"
    )
    try:

        @app.task(name="endings.refused", max_attempts=3, retry=AT_ONCE)
        async def refused() -> None:
            raise RuntimeError("refuse me")

        @app.task(name="endings.fine")
        async def fine(n: int) -> None:
            pass

        @app.task(name="endings.fails", max_attempts=1)
        async def fails() -> None:
            raise ValueError("an ordinary failure")

        refused_id = await refused.defer()
        fine_ids = [await fine.defer(n) for n in range(5)]
        fails_id = await fails.defer()

        await drain(concurrency=10)

        for job_id in fine_ids:
            assert state(db, job_id)[:2] == ("done", 1)
        status, _, last_error = state(db, fails_id)
        assert status == "failed" and last_error is not None
        assert last_error.startswith("ValueError: an ordinary failure")
        status, attempts, last_error = state(db, refused_id)
        assert (status, attempts) == ("failed", 1)
        assert last_error is not None and "could not be recorded" in last_error
        assert "endings_refused" in last_error
    finally:
        db.execute("ALTER TABLE asyncq_jobs DROP CONSTRAINT endings_refused")
