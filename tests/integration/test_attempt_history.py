"""Every attempt kept with its job (migration 0020): the done attempt described by the row
itself (the plain path writes nothing more), every other end of an attempt appended to a
bounded history; `admin.job` lists them all as `attempts`, with wait and run times."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq import admin, pools
from asyncq.job import Job

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)


def row(db: psycopg.Connection[Any], job_id: int, *columns: str) -> tuple[Any, ...]:
    found = db.execute(
        f"SELECT {', '.join(columns)} FROM asyncq_jobs WHERE id = %s",  # type: ignore[arg-type]
        (job_id,),
    ).fetchone()
    assert found is not None
    return found


async def detail(app: asyncq.App, job_id: int) -> admin.JobDetail:
    async with pools.connection(app.pool) as conn:
        found = await admin.job(conn, app.store, job_id)
    assert found is not None
    return found


async def test_each_attempt_is_kept_with_its_worker_times_outcome_and_error(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    @app.task(name="history.third_time", retry=AT_ONCE)
    async def third_time() -> str:
        attempt = asyncq.current_job().attempt
        if attempt < 3:
            raise ValueError(f"not yet ({attempt})")
        return "ok"

    job_id = await third_time.defer()
    assert await settle([job_id]) == [(job_id, "done", 3)]

    found = await detail(app, job_id)
    assert [(a.attempt, a.outcome) for a in found.attempts] == [
        (1, "retried"),
        (2, "retried"),
        (3, "done"),
    ]
    assert found.attempts_used == 3 and found.attempts_dropped == 0
    for attempt in found.attempts:
        assert attempt.worker is not None and attempt.worker.count(":") == 2
        assert attempt.started_at is not None and attempt.ended_at is not None
        assert attempt.due_at is not None and attempt.due_at <= attempt.started_at
        assert attempt.wait_seconds is not None and attempt.wait_seconds >= 0
        assert attempt.run_seconds is not None and attempt.run_seconds >= 0
    first, second, done = found.attempts
    assert first.error is not None and first.error.startswith("ValueError: not yet (1)")
    assert "Traceback (most recent call last)" in first.error
    assert second.error is not None and second.error.startswith("ValueError: not yet (2)")
    assert done.error is None
    # Each attempt was due when the one before it ended (no backoff), and started after.
    assert second.due_at == first.ended_at and done.due_at == second.ended_at
    # The done attempt is the row's own columns.
    started_at, finished_at, locked_by = row(db, job_id, "started_at", "finished_at", "locked_by")
    assert (done.started_at, done.ended_at, done.worker) == (started_at, finished_at, locked_by)

    as_json = json.loads(admin.as_json(found))
    assert [a["outcome"] for a in as_json["attempts"]] == ["retried", "retried", "done"]
    assert as_json["attempts_used"] == 3


async def test_a_job_done_at_its_first_attempt_writes_no_history(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    @app.task(name="history.plain")
    async def plain() -> None:
        pass

    job_id = await plain.defer()
    await drain()
    history, logs, progress, started_at = row(
        db, job_id, "history", "logs", "progress", "started_at"
    )
    assert (history, logs, progress) == (None, None, None)
    assert started_at is not None  # set by the claim
    [attempt] = (await detail(app, job_id)).attempts
    assert (attempt.attempt, attempt.outcome, attempt.error, attempt.logs) == (
        1,
        "done",
        None,
        None,
    )


async def test_the_history_keeps_the_first_three_and_the_last_ten(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    runs = 0

    @app.task(name="history.snoozes")
    async def snoozes(times: int) -> None:
        nonlocal runs
        runs += 1
        asyncq.current_job().progress(runs)  # each record says which run it was
        if runs <= times:
            raise asyncq.Snooze(0)

    job_id = await snoozes.defer(times=20)
    assert await settle([job_id]) == [(job_id, "done", 1)]
    history = row(db, job_id, "history")[0]
    assert history["dropped"] == 7
    assert len(history["attempts"]) == 13

    found = await detail(app, job_id)
    assert found.attempts_dropped == 7
    assert [a.outcome for a in found.attempts] == ["snoozed"] * 13 + ["done"]
    kept = [a.progress.count for a in found.attempts if a.progress is not None]
    assert kept == [1, 2, 3, *range(11, 22)]


async def test_a_rescued_attempt_names_the_worker_that_stopped_renewing_it(
    app: asyncq.App, db: Any
) -> None:
    [(job_id,)] = db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, attempts, claims, locked_by, locked_at,"
        "                         started_at, lease, expires_at)"
        " VALUES ('history.lost', 'running', 1, 1, 'gone:1:abc', now() - interval '1 min',"
        "         now() - interval '2 min', interval '30 s', now() - interval '30 s')"
        " RETURNING id"
    ).fetchall()
    async with pools.connection(app.pool) as conn:
        assert await app.store.reap_expired(conn, limit=10) == {job_id: "queued"}
    [attempt] = (await detail(app, job_id)).attempts
    assert (attempt.attempt, attempt.outcome, attempt.worker) == (1, "lease_expired", "gone:1:abc")
    assert attempt.error is not None and attempt.error.startswith("LeaseExpired: worker gone:1:abc")
    assert attempt.run_seconds is not None and attempt.run_seconds >= 120


async def test_cancelled_handed_back_given_back_and_waiting_attempts_are_kept(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    started = asyncio.Event()

    @app.task(name="history.long")
    async def long() -> None:
        started.set()
        await asyncio.sleep(60)

    @app.task(name="history.sleeper")
    async def sleeper() -> None:
        await asyncq.current_job().sleep(3600)

    cancelled = await long.defer()
    waiting = await sleeper.defer()
    [(unknown,)] = db.execute(
        "INSERT INTO asyncq_jobs (task_name) VALUES ('history.nobody_knows') RETURNING id"
    ).fetchall()

    async def cancel_once_started() -> None:
        await started.wait()
        assert await app.cancel(cancelled) == {cancelled: "aborting"}

    async with asyncio.TaskGroup() as group:
        group.create_task(cancel_once_started())
        group.create_task(drain())

    [ended] = (await detail(app, cancelled)).attempts
    assert ended.outcome == "cancelled" and "aborted by a cancel" in (ended.error or "")
    [suspended] = (await detail(app, waiting)).attempts
    assert (suspended.outcome, suspended.waiting_for) == ("waiting", "sleep")
    [gave] = (await detail(app, unknown)).attempts
    assert gave.outcome == "given_back" and "history.nobody_knows" in (gave.error or "")

    # A hand-back at shutdown: the worker is cancelled while the job runs.
    started.clear()
    handed = await long.defer()
    worker = asyncio.create_task(app.run_worker(handle_signals=False))
    await started.wait()
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    [back] = (await detail(app, handed)).attempts
    assert (back.attempt, back.outcome) == (1, "handed_back")
    assert row(db, handed, "status", "attempts") == ("queued", 0)


async def test_a_done_job_run_again_keeps_its_done_attempt(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    @app.task(name="history.again")
    async def again() -> None:
        asyncq.current_job().progress(1.0, "all of it")

    job_id = await again.defer()
    await drain()
    assert await app.retry(job_id) == "done"
    assert row(db, job_id, "progress", "logs", "started_at") == (None, None, None)
    await drain()
    found = await detail(app, job_id)
    assert [(a.attempt, a.outcome) for a in found.attempts] == [(1, "done"), (1, "done")]
    first = found.attempts[0]
    assert first.progress is not None and first.progress.message == "all of it"
    assert first.ended_at is not None and first.started_at is not None


async def test_a_worker_without_the_lease_writes_no_attempt(app: asyncq.App, db: Any) -> None:
    """The writes that end attempts are fenced as before: another claim's worker, or a
    claim since, appends nothing."""
    [(job_id,)] = db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, attempts, claims, locked_by, locked_at,"
        "                         started_at, lease, expires_at)"
        " VALUES ('history.held', 'running', 1, 2, 'w', now(), now(), interval '30 s',"
        "         now() + interval '30 s') RETURNING id"
    ).fetchall()
    stale = Job(job_id, "history.held", "default", "{}", 1, 3, 1)
    async with pools.connection(app.pool) as conn:
        written = await app.store.mark_failed(
            conn,
            worker="w",
            jobs=[stale],
            retry_in=[0.0],
            errors=["ValueError: late"],
            give_up=[False],
            logs=['{"records": [], "dropped": 0}'],
            progress=['{"count": 1}'],
        )
        assert written == {}
        assert (
            await app.store.write_progress(
                conn, worker="w", jobs=[stale], progress=['{"count": 2}']
            )
            == set()
        )
    assert row(db, job_id, "history", "progress", "status") == (None, None, "running")
