"""A task steering its own job (Retry, Snooze, Discard, retry_on, timeout), and middleware
around every attempt, with a real worker on a real database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import asyncq
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)


def row(db: Any, job_id: int) -> tuple[Any, ...]:
    found = db.execute(
        "SELECT status::text, attempts, last_error, claims FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return tuple(found)


async def test_retry_after_counts_the_attempt_and_waits_as_asked(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    @app.task(name="control.retry", max_attempts=3, retry=asyncq.Backoff(base=3600, cap=3600))
    async def retry_soon() -> None:
        if asyncq.current_job().attempt < 3:
            raise asyncq.Retry(after=0.1, reason="the gateway said later")

    job_id = await retry_soon.defer()
    await settle([job_id])  # the task's own backoff (an hour) would not end in time
    status, attempts, last_error, claims = row(db, job_id)
    assert (status, attempts, claims) == ("done", 3, 3)
    assert "the gateway said later" in last_error


async def test_retry_on_the_last_attempt_fails_the_job(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    @app.task(name="control.retry_last", max_attempts=1)
    async def retry_last() -> None:
        raise asyncq.Retry(after=0)

    job_id = await retry_last.defer()
    await settle([job_id])
    assert row(db, job_id)[:2] == ("failed", 1)


async def test_snooze_runs_again_later_without_counting_the_attempt(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    seen: list[int] = []

    @app.task(name="control.snooze", max_attempts=1)
    async def snoozes() -> None:
        seen.append(asyncq.current_job().attempt)
        if len(seen) < 3:
            raise asyncq.Snooze(0.05)

    job_id = await snoozes.defer()
    await settle([job_id])
    assert seen == [1, 1, 1]  # one attempt, however often it snoozed
    status, attempts, last_error, claims = row(db, job_id)
    assert (status, attempts, last_error, claims) == ("done", 1, None, 3)


async def test_discard_fails_the_job_at_once_with_its_reason(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    @app.task(name="control.discard", max_attempts=5, retry=AT_ONCE)
    async def discards(order: int) -> None:
        raise asyncq.Discard(f"order {order} was deleted")

    job_id = await discards.defer(7)
    stats = await drain()
    assert row(db, job_id)[:3] == ("failed", 1, "Discard: order 7 was deleted")
    assert stats.failed_attempts == 1


async def test_retry_on_retries_only_the_errors_it_names(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    @app.task(name="control.retry_on", max_attempts=3, retry=AT_ONCE, retry_on=(ConnectionError,))
    async def picky(kind: str) -> None:
        if asyncq.current_job().attempt == 1:
            raise ConnectionError("flaky") if kind == "net" else ValueError("a bug")

    net = await picky.defer("net")
    bug = await picky.defer("bug")
    await settle([net, bug])
    assert row(db, net)[:2] == ("done", 2)
    status, attempts, last_error, _ = row(db, bug)
    assert (status, attempts) == ("failed", 1)
    assert last_error.startswith("ValueError: a bug")


async def test_a_timeout_cancels_only_that_attempt_and_says_it_timed_out(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    finished: list[str] = []

    @app.task(name="control.timeout", max_attempts=2, retry=AT_ONCE, timeout=0.2)
    async def sometimes_slow() -> None:
        try:
            if asyncq.current_job().attempt == 1:
                await asyncio.sleep(30)
        finally:
            finished.append(f"attempt {asyncq.current_job().attempt} ended")

    @app.task(name="control.neighbour")
    async def neighbour() -> None:
        # Runs beside the one that times out, untouched, until that one has ended.
        await until(lambda: "attempt 1 ended" in finished, what="the slow attempt to time out")
        finished.append("neighbour")

    slow = await sometimes_slow.defer()
    other = await neighbour.defer()
    await settle([slow, other], concurrency=4)
    status, attempts, last_error, _ = row(db, slow)
    assert (status, attempts) == ("done", 2)
    assert last_error == "TimeoutError: attempt 1 of 2 timed out after 0.2s and was cancelled"
    assert row(db, other)[:2] == ("done", 1)
    assert sorted(finished) == ["attempt 1 ended", "attempt 2 ended", "neighbour"]


async def test_middleware_runs_around_every_attempt_in_order(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    calls: list[str] = []

    @app.middleware
    async def outer(job: asyncq.JobContext, call_next: Any) -> Any:
        calls.append(f"outer in {job.task_name} {job.attempt}")
        try:
            return await call_next()
        finally:
            calls.append("outer out")

    @app.middleware
    async def inner(job: asyncq.JobContext, call_next: Any) -> Any:
        assert asyncq.current_job().id == job.id  # the job's context is set already
        calls.append("inner in")
        return await call_next()

    @app.task(name="control.mw", max_attempts=2, retry=AT_ONCE)
    async def works() -> None:
        calls.append("task")
        if asyncq.current_job().attempt == 1:
            raise RuntimeError("once")

    await works.defer()
    await drain()
    assert calls == [
        "outer in control.mw 1",
        "inner in",
        "task",
        "outer out",
        "outer in control.mw 2",
        "inner in",
        "task",
        "outer out",
    ]
