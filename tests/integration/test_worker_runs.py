"""Running jobs: the job context, retries with backoff, and failures for good."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest

import asyncq

pytestmark = pytest.mark.anyio

FAST = asyncq.Backoff(base=0.05, cap=0.1)


async def db_clock(conn: psycopg.AsyncConnection[Any]) -> datetime:
    row = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def row_run_at(conn: psycopg.AsyncConnection[Any], job_id: int) -> datetime:
    cur = await conn.execute("SELECT run_at FROM asyncq_jobs WHERE id = %s", (job_id,))
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def test_current_job_inside_a_task(app: asyncq.App, db: Any, drain: Any) -> None:
    seen: list[asyncq.JobContext] = []

    @app.task(queue="ctx", max_attempts=4, name="ctx.task")
    async def inspect_me() -> None:
        seen.append(asyncq.current_job())

    job_id = await inspect_me.defer()
    other_id = await inspect_me.options(queue="ctx2", max_attempts=2).defer()
    stats = await drain()
    assert stats.done == 2
    by_id = {ctx.id: ctx for ctx in seen}
    ctx = by_id[job_id]
    assert (ctx.id, ctx.task_name, ctx.queue, ctx.attempt, ctx.max_attempts) == (
        job_id,
        "ctx.task",
        "ctx",
        1,
        4,
    )
    other = by_id[other_id]
    assert (other.queue, other.max_attempts, other.attempt) == ("ctx2", 2, 1)
    # The context is gone again outside the task.
    with pytest.raises(asyncq.NotInJob):
        asyncq.current_job()


async def test_current_job_is_per_job_under_concurrency(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    seen: list[tuple[int, int]] = []
    both_running = anyio.Event()
    started = 0

    @app.task
    async def mine(n: int) -> None:
        nonlocal started
        started += 1
        if started == 2:
            both_running.set()
        with anyio.fail_after(10):
            await both_running.wait()
        seen.append((n, asyncq.current_job().id))

    ids = [await mine.defer(n) for n in range(2)]
    await drain(concurrency=2)
    assert sorted(seen) == [(0, ids[0]), (1, ids[1])]


async def test_current_job_outside_a_job_raises(app: asyncq.App) -> None:
    with pytest.raises(asyncq.NotInJob):
        asyncq.current_job()


async def test_retry_then_success_pushes_run_at_out_after_each_failure(
    app: asyncq.App, db: Any, aconn: psycopg.AsyncConnection[Any], settle: Any
) -> None:
    # (attempt, db time at the start of the attempt, the row's run_at during it)
    starts: list[tuple[int, datetime, datetime]] = []
    failed_at: list[datetime] = []

    @app.task(retry=FAST)
    async def flaky() -> str:
        job = asyncq.current_job()
        starts.append((job.attempt, await db_clock(aconn), await row_run_at(aconn, job.id)))
        if job.attempt < 3:
            failed_at.append(await db_clock(aconn))
            raise ConnectionError(f"flaky attempt {job.attempt}")
        return "ok"

    job_id = await flaky.defer()
    assert await settle([job_id]) == [(job_id, "done", 3)]
    assert [s[0] for s in starts] == [1, 2, 3]
    for failure, (attempt, started, run_at) in zip(failed_at, starts[1:], strict=True):
        # The retry's run_at is at least the backoff base after the failure, at most the
        # jittered cap (plus the time to write the outcome), and the retry waited for it.
        pushed = (run_at - failure).total_seconds()
        assert 0.05 <= pushed <= 0.15 + 2.0, (attempt, pushed)
        assert started >= run_at
    row = db.execute(
        "SELECT status::text, attempts, last_error, finished_at, locked_by"
        "  FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row[0:2] == ("done", 3)
    assert row[3] is not None  # finished_at


async def test_a_task_that_always_fails_ends_failed(app: asyncq.App, db: Any, settle: Any) -> None:
    calls = 0

    @app.task(retry=FAST, max_attempts=3)
    async def always_fails(order: int) -> None:
        nonlocal calls
        calls += 1
        raise ValueError(f"order {order} is broken")

    job_id = await always_fails.defer(17)
    assert await settle([job_id]) == [(job_id, "failed", 3)]
    assert calls == 3
    status, attempts, max_attempts, last_error, finished_at, created_at = db.execute(
        "SELECT status::text, attempts, max_attempts, last_error, finished_at, created_at"
        "  FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert (status, attempts, max_attempts) == ("failed", 3, 3)
    assert "ValueError" in last_error
    assert "order 17 is broken" in last_error
    assert "Traceback (most recent call last)" in last_error
    assert "always_fails" in last_error  # the task's own frame is in the traceback
    assert finished_at is not None and finished_at >= created_at


async def test_failed_job_is_not_run_again(app: asyncq.App, db: Any, drain: Any) -> None:
    calls = 0

    @app.task(max_attempts=1)
    async def once() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("no")

    job_id = await once.defer()
    await drain()
    await drain()
    assert calls == 1
    assert db.execute("SELECT status::text FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()[
        0
    ] == ("failed")


async def test_default_backoff_waits_at_least_a_second(
    app: asyncq.App, db: Any, aconn: psycopg.AsyncConnection[Any], drain: Any
) -> None:
    failed_at: list[datetime] = []

    @app.task
    async def fails_once() -> None:
        failed_at.append(await db_clock(aconn))
        raise OSError("down")

    job_id = await fails_once.defer()
    stats = await drain()  # one attempt: the retry is not ready, so the drain ends
    assert stats.claimed == 1 and stats.failed_attempts == 1
    status, attempts, run_at, wait, last_error = db.execute(
        "SELECT status::text, attempts, run_at,"
        "       extract(epoch FROM run_at - now())::float8, last_error"
        "  FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert (status, attempts) == ("queued", 1)
    assert "OSError: down" in last_error
    assert run_at - failed_at[0] >= timedelta(seconds=1)
    assert run_at - failed_at[0] <= timedelta(seconds=1.5 + 2.0)
    assert wait > 0  # still in the future after the drain returned


async def test_worker_stats_count_what_happened(app: asyncq.App, db: Any, drain: Any) -> None:
    @app.task(max_attempts=1)
    async def maybe(ok: bool) -> None:
        if not ok:
            raise RuntimeError("asked to fail")

    await maybe.defer_many([{"ok": True}, {"ok": True}, {"ok": False}])
    stats = await drain()
    assert isinstance(stats, asyncq.WorkerStats)
    assert (stats.claimed, stats.done, stats.failed_attempts, stats.released) == (3, 2, 1, 0)
    counts = dict(db.execute("SELECT status::text, count(*) FROM asyncq_jobs GROUP BY 1"))
    assert counts == {"done": 2, "failed": 1}


@pytest.mark.parametrize("batch_size", [8, 3], ids=["one claim loop", "two claim loops"])
async def test_many_jobs_with_concurrency_all_run_once(
    app: asyncq.App, db: Any, drain: Any, batch_size: int
) -> None:
    ran: list[int] = []
    running = 0
    peak = 0

    @app.task
    async def work(n: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.002)
        running -= 1
        ran.append(n)

    await work.defer_many([{"n": n} for n in range(200)])
    stats = await drain(concurrency=8, batch_size=batch_size)
    assert sorted(ran) == list(range(200))
    assert stats.done == 200
    assert 1 < peak <= 8
    row = db.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'), max(attempts) FROM asyncq_jobs"
    ).fetchone()
    assert row == (200, 1)


async def test_plain_sql_insert_wakes_a_waiting_worker(app: asyncq.App, db: Any, dsn: str) -> None:
    ran: list[str] = []
    first_done = anyio.Event()
    second_done = anyio.Event()

    @app.task
    async def note(label: str) -> None:
        ran.append(label)
        (first_done if label == "first" else second_done).set()

    await note.defer("first")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            # A long poll interval: only the notification can bring the second job in quickly.
            tg.start_soon(lambda: app.run_worker(handle_signals=False, poll_interval=60))
            await first_done.wait()
            with anyio.fail_after(30):  # well before the next poll
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    await conn.execute(
                        "INSERT INTO asyncq_jobs (task_name, args) VALUES (%s, %s)",
                        (note.name, '{"label": "second"}'),
                    )
                await second_done.wait()
            tg.cancel_scope.cancel()
    assert ran == ["first", "second"]


async def test_cancelling_the_worker_hands_back_its_running_jobs(app: asyncq.App, db: Any) -> None:
    started = anyio.Event()

    @app.task(name="runs.long")
    async def long() -> None:
        started.set()
        await anyio.sleep(30)

    job_id = await long.defer()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run_worker(lease=60, handle_signals=False))
        with anyio.fail_after(10):
            await started.wait()
        tg.cancel_scope.cancel()
    row = db.execute(
        "SELECT status::text, attempts, handbacks, run_at <= now() FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == ("queued", 0, 1, True)
