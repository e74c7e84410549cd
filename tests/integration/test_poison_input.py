"""Jobs that cannot run properly: recorded as errors, never a crash, never dropped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest

import asyncq

pytestmark = pytest.mark.anyio


def insert(db: Any, task_name: str, args: str, **columns: Any) -> int:
    names = ["task_name", "args", *columns]
    values = [task_name, args, *columns.values()]
    row = db.execute(
        f"INSERT INTO asyncq_jobs ({', '.join(names)})"
        f" VALUES ({', '.join(['%s'] * len(names))}) RETURNING id",
        values,
    ).fetchone()
    return int(row[0])


def job(db: Any, job_id: int) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT status::text, attempts, last_error, finished_at IS NOT NULL"
        "  FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def make_ready(db: Any, job_id: int) -> None:
    """Skip the backoff wait of a queued retry (the clock moving on)."""
    db.execute(
        "UPDATE asyncq_jobs SET run_at = now() WHERE id = %s AND status = 'queued'", (job_id,)
    )


async def test_an_unknown_task_is_given_back_uncounted_then_failed_after_the_grace(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    """A job of a task this worker does not know costs it no attempt: it is given back
    (for a worker that knows it), and the worker claims no more of that task's jobs. Only
    once no worker has taken it for the grace since the first give-back does it fail,
    naming the task."""
    ran: list[int] = []

    @app.task
    async def good(n: int) -> None:
        ran.append(n)

    poison = insert(db, "no.such.task", "{}")
    await good.defer(1)

    stats = await drain()
    assert ran == [1]
    assert (stats.done, stats.failed_attempts, stats.given_back) == (1, 0, 1)
    status, attempts, last_error, finished = job(db, poison)
    assert (status, attempts, finished) == ("queued", 0, False)  # not counted, not dropped
    assert "no.such.task" in last_error and "TaskNotFound" in last_error
    [(first_given_back,)] = db.execute(
        "SELECT unknown_since FROM asyncq_jobs WHERE id = %s", (poison,)
    ).fetchall()
    assert first_given_back is not None

    # Given back again and again (other workers, each of which skips it afterwards):
    # never counted, and the first give-back's time stays.
    for n in (2, 3):
        make_ready(db, poison)
        await good.defer(n)
        await drain()
        assert job(db, poison)[:2] == ("queued", 0)
    assert db.execute(
        "SELECT unknown_since FROM asyncq_jobs WHERE id = %s", (poison,)
    ).fetchall() == [(first_given_back,)]
    assert ran == [1, 2, 3]

    # Within the grace nothing fails; past it, the maintenance fails it.
    async with app.pool.connection() as conn:
        assert await app.store.fail_unknown(conn, grace=timedelta(minutes=10), limit=10) == []
    db.execute("UPDATE asyncq_jobs SET unknown_since = now() - interval '11 minutes'")
    async with app.pool.connection() as conn:
        failed = await app.store.fail_unknown(conn, grace=timedelta(minutes=10), limit=10)
    assert failed == [poison]
    status, attempts, last_error, finished = job(db, poison)
    assert (status, finished) == ("failed", True)
    assert "no.such.task" in last_error and "TaskNotFound" in last_error


async def test_a_worker_that_knows_the_task_runs_what_another_gave_back(
    app: asyncq.App, dsn: str, db: Any, drain: Any
) -> None:
    """Two Apps on one table, each with a task the other lacks: every job runs on the
    worker that knows it, and none is counted or failed by the other."""
    ran: list[str] = []

    @app.task(name="apps.first")
    async def first(n: int) -> None:
        ran.append(f"first {n}")

    other = asyncq.App(dsn)

    @other.task(name="apps.second")
    async def second(n: int) -> None:
        ran.append(f"second {n}")

    async with other:
        ids = [await first.defer(n) for n in range(5)]
        ids += [await other.tasks["apps.second"].defer(n) for n in range(5)]
        with anyio.fail_after(30):
            while True:
                await drain()
                async with other.connection() as conn:
                    await conn.execute(
                        "UPDATE asyncq_jobs SET run_at = now() WHERE status = 'queued'"
                    )
                await other.run_worker(drain=True, handle_signals=False)
                left = db.execute(
                    "SELECT count(*) FROM asyncq_jobs WHERE status <> 'done'"
                ).fetchone()
                if left == (0,):
                    break
    assert sorted(ran) == sorted(
        [f"first {n}" for n in range(5)] + [f"second {n}" for n in range(5)]
    )
    assert db.execute(
        "SELECT max(attempts), count(*) FROM asyncq_jobs WHERE id = ANY(%s)", (ids,)
    ).fetchone() == (1, 10)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ('{"a": 1}', "required positional argument: 'b'"),
        ('{"a": 1, "b": 2, "zzz": 3}', "zzz"),
        ("[1, 2]", "JSON object"),
        ('"a string"', "JSON object"),
        ("null", "JSON object"),
        ("42", "JSON object"),
    ],
)
async def test_args_that_do_not_fit_are_a_recorded_error(
    app: asyncq.App, db: Any, drain: Any, args: str, expected: str
) -> None:
    calls: list[Any] = []

    @app.task(name="fits")
    async def fits(a: int, b: int) -> None:
        calls.append((a, b))

    bad = insert(db, "fits", args, max_attempts=1)
    fine = await fits.defer(1, b=2)
    stats = await drain()
    assert calls == [(1, 2)]  # the bad job never called the function; the good one ran
    assert stats.done == 1 and stats.failed_attempts == 1
    status, attempts, last_error, finished = job(db, bad)
    assert (status, attempts, finished) == ("failed", 1, True)
    assert "TaskArgumentsMismatch" in last_error
    assert expected in last_error
    assert job(db, fine)[0] == "done"


async def test_bad_args_are_retried_like_any_error(app: asyncq.App, db: Any, drain: Any) -> None:
    @app.task(name="fits")
    async def fits(a: int) -> None:
        raise AssertionError("never called")

    bad = insert(db, "fits", "[]")
    await drain()
    status, attempts, last_error, _ = job(db, bad)
    assert (status, attempts) == ("queued", 1)
    assert "TaskArgumentsMismatch" in last_error


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ('{"first": 1, "rest": "no"}', "JSON array"),
        ('{"rest": [2, 3]}', "earlier positional"),
        ('{"first": 1, "first_only": 2}', "first_only"),
    ],
)
async def test_stored_args_for_star_args_that_do_not_fit(
    app: asyncq.App, db: Any, drain: Any, args: str, expected: str
) -> None:
    @app.task(name="star")
    async def star(first: int, /, *rest: int) -> None:
        raise AssertionError("never called")

    bad = insert(db, "star", args, max_attempts=1)
    await drain()
    status, _, last_error, _ = job(db, bad)
    assert status == "failed"
    assert "TaskArgumentsMismatch" in last_error
    assert expected in last_error


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, GeneratorExit])
async def test_base_exceptions_in_a_task_are_recorded_failures(
    app: asyncq.App, db: Any, drain: Any, exc_type: type[BaseException]
) -> None:
    ran: list[str] = []

    @app.task(max_attempts=1)
    async def explode() -> None:
        ran.append("explode")
        raise exc_type("bye")

    @app.task
    async def after() -> None:
        ran.append("after")

    bad = await explode.options(priority=10).defer()
    await after.defer()  # lower priority: runs after the explosion, on the same worker
    stats = await drain(concurrency=1)
    assert ran == ["explode", "after"]
    assert stats.done == 1 and stats.failed_attempts == 1
    status, attempts, last_error, finished = job(db, bad)
    assert (status, attempts, finished) == ("failed", 1, True)
    assert exc_type.__name__ in last_error


async def test_sys_exit_with_code_is_recorded(app: asyncq.App, db: Any, drain: Any) -> None:
    import sys

    @app.task(max_attempts=1)
    async def quits() -> None:
        sys.exit(3)

    bad = await quits.defer()
    await drain()
    status, _, last_error, _ = job(db, bad)
    assert status == "failed"
    assert "SystemExit: 3" in last_error


async def test_plain_sql_insert_with_defaults_is_run(app: asyncq.App, db: Any, drain: Any) -> None:
    seen: list[tuple[str, int, int]] = []

    @app.task
    async def greet(name: str) -> None:
        ctx = asyncq.current_job()
        seen.append((name, ctx.attempt, ctx.max_attempts))

    job_id = insert(db, greet.name, '{"name": "from SQL"}')
    status, attempts, queue, priority, max_attempts = db.execute(
        "SELECT status::text, attempts, queue, priority, max_attempts"
        "  FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert (status, attempts, queue, priority, max_attempts) == ("queued", 0, "default", 0, 3)
    await drain()
    assert seen == [("from SQL", 1, 3)]
    assert job(db, job_id)[0:2] == ("done", 1)


async def test_plain_sql_insert_without_args_runs_a_no_argument_task(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    ran: list[bool] = []

    @app.task(name="tick")
    async def tick() -> None:
        ran.append(True)

    row = db.execute("INSERT INTO asyncq_jobs (task_name) VALUES ('tick') RETURNING id").fetchone()
    await drain()
    assert ran == [True]
    assert job(db, int(row[0]))[0] == "done"


async def test_a_failing_task_does_not_disturb_concurrent_jobs(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    @app.task(max_attempts=1)
    async def maybe(n: int) -> None:
        if n % 3 == 0:
            raise RuntimeError(f"bad {n}")

    ids = await maybe.defer_many([{"n": n} for n in range(30)])
    await drain(concurrency=5)
    statuses = dict(
        db.execute("SELECT id, status::text FROM asyncq_jobs WHERE id = ANY(%s)", (ids,))
    )
    assert [statuses[i] for i in ids] == ["failed" if n % 3 == 0 else "done" for n in range(30)]


@pytest.mark.parametrize("message", ["NUL \x00 in the message", "lone surrogate \ud800 here"])
async def test_error_text_postgres_cannot_store_is_escaped(
    app: asyncq.App, db: Any, drain: Any, message: str
) -> None:
    ran: list[str] = []

    @app.task(max_attempts=1)
    async def odd_error() -> None:
        raise ValueError(message)

    @app.task
    async def after() -> None:
        ran.append("after")

    bad = await odd_error.options(priority=1).defer()
    await after.defer()
    stats = await drain(concurrency=1)  # would never finish if the outcome could not be written
    assert ran == ["after"]
    assert stats.failed_attempts == 1
    status, _, last_error, _ = job(db, bad)
    assert status == "failed"
    assert "ValueError" in last_error
    assert ("\\x00" if "\x00" in message else "\\ud800") in last_error


async def test_huge_error_text_is_trimmed(app: asyncq.App, db: Any, drain: Any) -> None:
    @app.task(max_attempts=1)
    async def loud() -> None:
        raise RuntimeError("x" * 1_000_000)

    bad = await loud.defer()
    await drain()
    status, _, last_error, _ = job(db, bad)
    assert status == "failed"
    assert last_error.startswith("RuntimeError: xxx")
    assert len(last_error) <= 10_000
