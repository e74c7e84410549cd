"""The pytest plugin and `asyncq.testing`, as a user's suite sees them: test files run
in a sub-pytest (pytester) that finds the plugin by its entry point alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest

# A user's test module: its App, its tasks, and the override of asyncq_app.
USER_APP = """
import time

import pytest

import asyncq
from asyncq.testing import (
    DrainIncomplete, assert_deferred, assert_not_deferred, deferred_jobs, drain, inline,
)

pytestmark = pytest.mark.anyio
app = asyncq.App()
HOUR = asyncq.Backoff(base=3600, cap=3600, jitter=0)


@app.task(name="t.send", max_attempts=3)
async def send(n: int, tags: list[str] | None = None) -> int:
    return n


@app.task(name="t.flaky", max_attempts=3, retry=HOUR)
async def flaky(n: int) -> int:
    if asyncq.current_job().attempt < 3:
        raise RuntimeError(f"attempt {asyncq.current_job().attempt} fails")
    return n


@app.task(name="t.broken", max_attempts=4, retry=HOUR)
async def broken() -> None:
    raise RuntimeError("always")


@app.task(name="t.sleepy")
async def sleepy() -> None:
    raise asyncq.Snooze(3600)


@pytest.fixture
def asyncq_app():
    return app
"""


Run = Callable[..., pytest.RunResult]


@pytest.fixture
def run(pytester: pytest.Pytester, session_dsn: str) -> Run:
    """Run ``body`` (after the user's module) in a sub-pytest on the session database."""

    def run_body(body: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_user=USER_APP + body)
        return pytester.runpytest_inprocess(
            "-p", "no:cacheprovider", "-W", "error", f"--asyncq-dsn={session_dsn}", *args
        )

    return run_body


def test_each_test_gets_an_empty_schema_of_its_own(run: Run) -> None:
    result = run(
        """
async def test_first(asyncq_test_app):
    assert asyncq_test_app.schema.startswith("asyncq_test_")
    await send.defer(1)
    assert [job.args for job in await deferred_jobs(send)] == [{"n": 1}]

async def test_second_sees_none_of_the_first(asyncq_test_app):
    await assert_not_deferred(send)
    await send.defer(2)
    assert [job.args["n"] for job in await deferred_jobs(send)] == [2]

def test_the_app_is_given_back_as_it_was():
    assert app.schema is None and app.dsn_argument is None and not app.is_open
"""
    )
    result.assert_outcomes(passed=3)


def test_drain_runs_retries_without_sleeping_their_backoff(run: Run) -> None:
    result = run(
        """
async def test_retried_until_done(asyncq_test_app):
    await flaky.defer(7)
    started = time.monotonic()
    drained = await drain(asyncq_test_app)
    assert time.monotonic() - started < 30  # the backoff is an hour
    [job] = await deferred_jobs(flaky)
    assert (job.status, job.attempts) == ("done", 3)
    assert drained.failed_attempts == 2 and drained.done == 1

async def test_failing_for_ever_ends_at_max_attempts(asyncq_test_app):
    await broken.defer()
    await drain(asyncq_test_app)
    [job] = await deferred_jobs(broken)
    assert (job.status, job.attempts) == ("failed", 4)
    assert "RuntimeError: always" in job.last_error

async def test_a_job_due_later_waits_unless_scheduled(asyncq_test_app):
    await send.options(delay=3600).defer(1)
    await drain(asyncq_test_app)
    assert [job.status for job in await deferred_jobs(send)] == ["queued"]
    await drain(asyncq_test_app, scheduled=True)
    assert [job.status for job in await deferred_jobs(send)] == ["done"]

async def test_snoozing_for_ever_stops_at_max_passes(asyncq_test_app):
    job_id = await sleepy.defer()
    with pytest.raises(DrainIncomplete, match=rf"5 passes and job\\(s\\) \\[{job_id}\\]"):
        await drain(asyncq_test_app, max_passes=5)
"""
    )
    result.assert_outcomes(passed=4)


def test_assert_deferred_passes_and_fails_saying_what_was_deferred(run: Run) -> None:
    result = run(
        """
async def test_found(asyncq_test_app):
    await send.defer(1, tags=("a", "b"))
    job = await assert_deferred(send, n=1)
    assert job.status == "queued"
    await assert_deferred(send, tags=("a", "b"))  # compared after the JSON round trip
    await assert_not_deferred(send, n=2)

async def test_not_found(asyncq_test_app):
    await send.defer(1)
    await send.defer(3, tags=["x"])
    await assert_deferred(send, n=2)

async def test_none_at_all(asyncq_test_app):
    await assert_deferred(flaky)

async def test_unexpected(asyncq_test_app):
    await send.defer(2)
    await assert_not_deferred(send, n=2)
"""
    )
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.re_match_lines(
        [
            r'E\s+AssertionError: no job of t.send was deferred with arguments \{"n":2\};'
            r" its 2 job\(s\):",
            r'E\s+#\d+ queued \{"n":1\}',
            r'E\s+#\d+ queued \{"n":3,"tags":\["x"\]\}',
        ]
    )
    result.stdout.re_match_lines(
        [r"E\s+AssertionError: no job of t.flaky was deferred \(expected one\)"]
    )
    result.stdout.re_match_lines(
        [r'E\s+AssertionError: expected no job of t.send with arguments \{"n":2\}; found 1:']
    )


def test_inline_mode_round_trips_arguments_through_json(run: Run) -> None:
    result = run(
        """
import datetime

seen = []

@app.task(name="t.record")
async def record(when: object, tags: object = None) -> None:
    seen.append((when, tags, asyncq.current_job().attempt))

@pytest.fixture(autouse=True)
def forget():
    seen.clear()

async def test_runs_at_once_with_what_production_would_decode():
    with inline(app) as queue:
        job_id = await record.defer("2026-01-01", tags=("a", 1))
        assert seen == [("2026-01-01", ["a", 1], 1)]
        await assert_deferred(record, tags=["a", 1])
    assert [(job.id, job.status) for job in queue.jobs] == [(job_id, "done")]

async def test_rejects_what_is_not_json():
    with inline(app) as queue:
        with pytest.raises(TypeError, match="datetime"):
            await record.defer(datetime.datetime.now())
        with pytest.raises(TypeError):
            await record.defer("x", tags={1, 2})
    assert queue.jobs == [] and seen == []

async def test_collects_then_drains_without_a_database():
    with inline(app, run=False) as queue:
        await record.options(delay=60).defer("later")
        assert seen == [] and queue.jobs[0].status == "queued"
        assert (await drain(app)).claimed == 1
    assert seen == [("later", None, 1)]

async def test_jobs_end_as_a_worker_would_end_them():
    with inline(app) as queue:
        await sleepy.defer()  # a Snooze: queued again, not raised
        with pytest.raises(RuntimeError, match="always"):
            await broken.defer()  # an error: raised, and queued for its retry
        assert [(job.status, job.attempts) for job in queue.jobs] == [("queued", 0), ("queued", 1)]
    with inline(app, raise_errors=False) as queue:
        await flaky.defer(3)
        await broken.defer()
        await drain(app)
    assert [(job.task_name, job.status, job.attempts) for job in queue.jobs] == [
        ("t.flaky", "done", 3),
        ("t.broken", "failed", 4),
    ]
    assert queue.jobs[1].last_error.startswith("RuntimeError: always")
    with inline(app) as queue:
        await sleepy.defer()
        with pytest.raises(DrainIncomplete, match=r"3 passes over the inline jobs"):
            await drain(app, max_passes=3)
""",
        "--asyncq-dsn=postgresql://nobody@127.0.0.1:1/none",
    )
    result.assert_outcomes(passed=4)


def test_def_tasks_and_defer_sync_with_the_plugin_and_inline(run: Run) -> None:
    result = run(
        """
import threading

ran_in = []

@app.task(name="t.resize")
def resize(path: str) -> str:
    ran_in.append(threading.current_thread().name)
    return path.upper()

async def test_defer_sync_then_drain(asyncq_test_app):
    resize.defer_sync("a.png")
    await assert_deferred(resize, path="a.png")
    assert (await drain(asyncq_test_app)).done == 1
    [job] = await deferred_jobs(resize)
    assert job.status == "done"
    assert await asyncq_test_app.result(job.id) == "A.PNG"

def test_inline_from_synchronous_code_runs_at_once_in_a_thread():
    ran_in.clear()
    with inline(app) as queue:
        resize.defer_sync("b.png")
    assert [(job.status, job.result) for job in queue.jobs] == [("done", "B.PNG")]
    assert ran_in and ran_in[0] != threading.current_thread().name

async def test_inline_under_an_event_loop_waits_for_drain():
    with inline(app) as queue:
        resize.defer_sync("c.png")
        assert queue.jobs[0].status == "queued"
        await drain(app)
    assert queue.jobs[0].status == "done"
"""
    )
    result.assert_outcomes(passed=3)


def test_drain_runs_every_ready_job_or_says_what_it_left(run: Run) -> None:
    result = run(
        """
from psycopg import sql


@app.task(name="t.rated", rate_limit="2/h")
async def rated(n: int) -> int:
    return n


@app.task(name="t.one_at_a_time", concurrency=1)
async def one_at_a_time(n: int) -> int:
    return n


@app.task(name="t.per_tenant", group_concurrency=1)
async def per_tenant(n: int) -> int:
    return n


async def test_rate_limits_are_lifted(asyncq_test_app):
    for n in range(6):
        await rated.defer(n)
    drained = await drain(asyncq_test_app)
    assert (drained.claimed, drained.done) == (6, 6)
    assert [job.status for job in await deferred_jobs(rated)] == ["done"] * 6
    starts = sql.Identifier(asyncq_test_app.schema, "asyncq_rate_starts")
    async with asyncq_test_app.pool.connection() as conn:  # none counts against a worker's
        cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(starts))
        assert await cur.fetchone() == (0,)

async def test_concurrency_limits_hold_and_every_job_runs(asyncq_test_app):
    for n in range(6):
        await one_at_a_time.defer(n)
        await per_tenant.options(group=f"tenant-{n % 2}").defer(n)
    drained = await drain(asyncq_test_app)
    assert (drained.claimed, drained.done) == (12, 12)

async def test_a_ready_job_in_a_paused_queue_is_not_left_silently(asyncq_test_app):
    job_id = await send.defer(1)
    await asyncq_test_app.pause("default")
    with pytest.raises(
        DrainIncomplete, match=rf"job\\(s\\) \\[{job_id}\\] are ready in the paused queue"
    ):
        await drain(asyncq_test_app)
    await asyncq_test_app.resume("default")
    assert (await drain(asyncq_test_app)).done == 1

async def test_a_limit_held_by_another_worker_is_not_left_silently(asyncq_test_app):
    elsewhere = await one_at_a_time.defer(0)
    waiting = await one_at_a_time.defer(1)
    jobs = sql.Identifier(asyncq_test_app.schema, "asyncq_jobs")
    async with asyncq_test_app.pool.connection() as conn:  # another worker runs one
        await conn.execute(
            sql.SQL(
                "UPDATE {} SET status = 'running', attempts = 1, claims = 1,"
                " locked_by = 'another worker', locked_at = now(),"
                " expires_at = now() + interval '1 hour' WHERE id = %s"
            ).format(jobs),
            (elsewhere,),
        )
    with pytest.raises(DrainIncomplete, match=rf"job\\(s\\) \\[{waiting}\\] are ready but"):
        await drain(asyncq_test_app)
"""
    )
    result.assert_outcomes(passed=4)


def test_inline_jobs_end_with_what_a_worker_would_store(run: Run) -> None:
    result = run(
        """
import asyncio

started = []


@app.task(name="t.pair")
async def pair() -> object:
    return (1, 2)


@app.task(name="t.tags")
async def tags() -> object:
    return {"a", "b"}


@app.task(name="t.cancelled", max_attempts=2)
async def cancelled() -> None:
    raise asyncio.CancelledError()


@app.task(name="t.waits")
async def waits() -> None:
    started[0].set()
    await asyncio.Event().wait()


async def test_a_result_is_its_json_round_trip_or_none_as_a_worker_stores_it(caplog):
    with inline(app) as queue:
        await pair.defer()
        await tags.defer()
    assert [(job.status, job.result) for job in queue.jobs] == [("done", [1, 2]), ("done", None)]
    assert queue.jobs[0].unstored is None
    assert "must be JSON-serialisable" in queue.jobs[1].unstored
    assert "is done, but its result is not stored" in caplog.text

async def test_a_cancelled_error_of_the_task_fails_its_attempt():
    with inline(app, raise_errors=False) as queue:
        await cancelled.defer()
        assert [(job.status, job.attempts) for job in queue.jobs] == [("queued", 1)]
        await drain(app)
    assert [(job.status, job.attempts) for job in queue.jobs] == [("failed", 2)]
    assert queue.jobs[0].last_error.startswith("asyncio.exceptions.CancelledError")
    with inline(app) as queue:
        with pytest.raises(asyncio.CancelledError):
            await cancelled.defer()
    assert [(job.status, job.attempts) for job in queue.jobs] == [("queued", 1)]

async def test_a_cancelled_caller_hands_the_job_back():
    started[:] = [asyncio.Event()]
    with inline(app) as queue:
        caller = asyncio.create_task(waits.defer())
        await started[0].wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
    assert [(job.status, job.attempts) for job in queue.jobs] == [("queued", 0)]
""",
        "--asyncq-dsn=postgresql://nobody@127.0.0.1:1/none",
    )
    result.assert_outcomes(passed=3)
