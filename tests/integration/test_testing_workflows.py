"""`asyncq.testing` runs workflows: `drain` with a real worker on the test schema (sleeps
moved forward, events emitted by the test, children, gathers and jobs after others, and
what is left waiting reported), and inline mode in memory (steps run for real and kept,
sleeps moved forward, events, children, dependencies, step_tx on the App's pool)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import asyncq
from asyncq import current_job
from asyncq.testing import DrainIncomplete, WaitingJob, deferred_jobs, drain, inline

pytestmark = pytest.mark.anyio

app = asyncq.App()
ran: list[str] = []  # what the steps and the tasks' own lines did, in order
NEVER = asyncq.Backoff(base=3600, cap=3600, jitter=0)


def record(what: str) -> str:
    ran.append(what)
    return what


@app.task(name="wf.sleeper")
async def sleeper() -> list[str]:
    ctx = current_job()
    first = await ctx.step("first", record, "first")
    await ctx.sleep(timedelta(days=1))
    second = await ctx.step("second", record, "second")
    await ctx.sleep_until(datetime.now(UTC) + timedelta(days=30))
    return [first, second]


@app.task(name="wf.for_ever")
async def for_ever() -> None:
    while True:
        await current_job().sleep(60)


@app.task(name="wf.approval")
async def approval(order_id: int) -> Any:
    ctx = current_job()
    await ctx.step("asked", record, f"asked {order_id}")
    try:
        return await ctx.wait_for_event(f"approved:{order_id}", timeout=3600)
    except asyncq.EventTimeout:
        return "timed out"


@app.task(name="wf.part", max_attempts=1)
async def part(n: int) -> int:
    await current_job().sleep(3600)
    if n < 0:
        raise ValueError(f"no part {n}")
    return n * 10


@app.task(name="wf.assembly")
async def assembly(parts: list[int]) -> list[Any]:
    ctx = current_job()
    ids = await ctx.spawn_many(part, [{"n": n} for n in parts])
    record(f"spawned {len(ids)}")
    gathered = await ctx.gather(ids, return_exceptions=True)
    return [g if isinstance(g, int) else f"{type(g).__name__} {g.job_id}" for g in gathered]


@app.task(name="wf.strict", max_attempts=1)
async def strict(parts: list[int]) -> list[int]:
    ctx = current_job()
    ids = [await ctx.spawn(part, n) for n in parts]
    return list(await ctx.gather(ids))


@app.task(name="wf.callback")
async def callback(note: str) -> str:
    return record(note)


@app.task(name="wf.waits_for_child")
async def waits_for_child() -> Any:
    ctx = current_job()
    [result] = await ctx.gather([await ctx.spawn(approval, 99)])
    return result


@app.task(name="wf.flaky", retry=NEVER)
async def flaky() -> str:
    ctx = current_job()
    charged = await ctx.step("charge", record, "charge")
    if ctx.attempt == 1:
        raise RuntimeError("the warehouse is down")
    return str(charged)


async def book(conn: psycopg.AsyncConnection[Any], order_id: int) -> int:
    record(f"book {order_id}")
    await conn.execute("INSERT INTO testing_ledger VALUES (%s)", (order_id,))
    return order_id


@app.task(name="wf.booked", retry=NEVER)
async def booked(order_id: int) -> int:
    ctx = current_job()
    total = int(await ctx.step_tx("book", book, order_id))
    if ctx.attempt == 1:
        raise RuntimeError("after the booking")
    return total


@pytest.fixture
def asyncq_app() -> asyncq.App:
    return app


@pytest.fixture(autouse=True)
def forget() -> Iterator[None]:
    ran.clear()
    yield
    ran.clear()


async def rows(test_app: asyncq.App, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """``query`` on the test schema ({} names it)."""
    async with test_app.pool.connection() as conn:
        statement = sql.SQL(query).format(sql.Identifier(test_app.schema or "public"))
        cur = await conn.execute(statement, params)
        return await cur.fetchall()


async def status(test_app: asyncq.App, job_id: int) -> tuple[Any, ...]:
    [row] = await rows(
        test_app, "SELECT status::text, waiting_for FROM {}.asyncq_jobs WHERE id = %s", job_id
    )
    return row


# -- drain: a real worker on the test schema ------------------------------------------


async def test_drain_moves_sleeps_forward(asyncq_test_app: asyncq.App) -> None:
    job_id = await sleeper.defer()
    with anyio.fail_after(30):
        drained = await drain(asyncq_test_app)
    assert await asyncq_test_app.result(job_id) == ["first", "second"]
    assert ran == ["first", "second"]  # each step ran once, across three runs
    assert (drained.done, drained.suspended, drained.waiting) == (1, 2, ())
    ends = await rows(
        asyncq_test_app,
        "SELECT (s.result ->> 'until')::timestamptz <= j.finished_at FROM {0}.asyncq_steps s"
        " JOIN {0}.asyncq_jobs j ON j.id = s.job_id"
        " WHERE s.job_id = %s AND s.name = 'asyncq.sleep' ORDER BY s.seq",
        job_id,
    )
    assert ends == [(True,), (True,)]  # the sleeps' recorded ends were moved to their pass


async def test_drain_stops_a_job_that_sleeps_for_ever(asyncq_test_app: asyncq.App) -> None:
    job_id = await for_ever.defer()
    with anyio.fail_after(30), pytest.raises(DrainIncomplete, match=r"or a sleep") as left:
        await drain(asyncq_test_app, max_passes=3)
    assert rf"[{job_id}]" in str(left.value)


async def test_drain_leaves_a_wait_for_an_event_until_the_test_emits_it(
    asyncq_test_app: asyncq.App,
) -> None:
    job_id = await approval.defer(7)
    with anyio.fail_after(30), pytest.raises(DrainIncomplete) as left:
        await drain(asyncq_test_app)
    [waiting] = left.value.waiting
    assert (waiting.id, waiting.task_name, waiting.waiting_for, waiting.event) == (
        job_id,
        "wf.approval",
        "event:approved:7",
        "approved:7",
    )
    assert waiting.run_at is not None  # its timeout: an hour away, not timed out early
    assert f"#{job_id} (wf.approval) waits for the event 'approved:7'" in str(left.value)
    assert await status(asyncq_test_app, job_id) == ("waiting", "event:approved:7")

    with anyio.fail_after(30):
        again = await drain(asyncq_test_app, allow_waiting=True)
    assert [job.id for job in again.waiting] == [job_id]
    assert await asyncq_test_app.emit_event("approved:7", {"by": "ada"})
    with anyio.fail_after(30):
        drained = await drain(asyncq_test_app)
    assert (drained.done, drained.waiting) == (1, ())
    assert await asyncq_test_app.result(job_id) == {"by": "ada"}
    assert ran == ["asked 7"]


async def test_drain_times_waits_out_only_when_asked(asyncq_test_app: asyncq.App) -> None:
    job_id = await approval.defer(8)
    with anyio.fail_after(30):
        await drain(asyncq_test_app, allow_waiting=True)
        assert await status(asyncq_test_app, job_id) == ("waiting", "event:approved:8")
        await drain(asyncq_test_app, timeouts=True)
    assert await asyncq_test_app.result(job_id) == "timed out"


async def test_drain_runs_children_their_sleeps_gathers_and_jobs_after(
    asyncq_test_app: asyncq.App,
) -> None:
    parent = await assembly.defer([1, -2, 3])
    done = await callback.options(after=[parent]).defer("after the assembly")
    with anyio.fail_after(30):
        drained = await drain(asyncq_test_app)
    children = [job.id for job in await deferred_jobs(part)]
    assert await asyncq_test_app.result(parent) == [10, f"ChildFailed {children[1]}", 30]
    assert await asyncq_test_app.result(done) == "after the assembly"
    assert ran == ["spawned 3", "spawned 3", "after the assembly"]
    assert drained.waiting == ()


async def test_drain_names_what_each_job_left_waiting_waits_for(
    asyncq_test_app: asyncq.App,
) -> None:
    parent = await waits_for_child.defer()
    later = await callback.options(after=[parent]).defer("never")
    with anyio.fail_after(30), pytest.raises(DrainIncomplete) as left:
        await drain(asyncq_test_app)
    [child] = [job.id for job in await deferred_jobs(approval)]
    assert [(job.id, job.waiting_for, job.on) for job in left.value.waiting] == [
        (parent, "jobs", (child,)),
        (later, "after", (parent,)),
        (child, "event:approved:99", ()),
    ]
    message = str(left.value)
    assert f"#{parent} (wf.waits_for_child) waits for job(s) [{child}] to end" in message
    assert f"#{later} (wf.callback) waits for job(s) [{parent}] to end (after=)" in message
    assert await asyncq_test_app.emit_event("approved:99", "yes")
    with anyio.fail_after(30):
        await drain(asyncq_test_app)
    assert await asyncq_test_app.result(parent) == "yes"
    assert await asyncq_test_app.result(later) == "never"


# -- inline mode: in memory -----------------------------------------------------------


async def test_inline_steps_run_once_and_are_kept_across_a_retry() -> None:
    with inline(app, raise_errors=False) as queue:
        await flaky.defer()
        [job] = queue.jobs
        assert (job.status, job.attempts, job.steps) == ("queued", 1, {("charge", 1): "charge"})
        await drain(app)
    assert (job.status, job.attempts, job.result) == ("done", 2, "charge")
    assert ran == ["charge"]


@app.task(name="wf.reports")
def reports(rows: int) -> None:
    current_job().progress(rows, "rows imported")


async def test_inline_a_task_s_progress_is_kept_on_its_job() -> None:
    with inline(app) as queue:
        await reports.defer(rows=7)
    [job] = queue.jobs
    assert job.progress is not None
    assert (job.progress["count"], job.progress["message"], job.progress["attempt"]) == (
        7,
        "rows imported",
        1,
    )


async def test_inline_sleeps_are_moved_forward_and_the_job_runs_again() -> None:
    with inline(app) as queue:
        await sleeper.defer()
    [job] = queue.jobs
    assert (job.status, job.result, job.attempts, job.claims) == (
        "done",
        ["first", "second"],
        1,
        3,
    )
    assert ran == ["first", "second"]
    sleeps = [step["until"] for (name, _), step in job.steps.items() if name == "asyncq.sleep"]
    assert len(sleeps) == 2
    assert all(datetime.fromisoformat(until) <= datetime.now(UTC) for until in sleeps)


async def test_inline_a_job_that_sleeps_for_ever_is_left_for_drain_to_report() -> None:
    with inline(app) as queue:
        await for_ever.defer()
        [job] = queue.jobs
        assert (job.status, job.waiting_for) == ("waiting", "sleep")
        with pytest.raises(DrainIncomplete, match=r"3 passes over the inline jobs .* a sleep"):
            await drain(app, max_passes=3)


async def test_inline_waits_for_an_event_until_it_is_emitted() -> None:
    with inline(app) as queue:
        await approval.defer(1)
        [job] = queue.jobs
        assert (job.status, job.waiting_for) == ("waiting", "event:approved:1")
        with pytest.raises(DrainIncomplete) as left:
            await drain(app)
        assert left.value.waiting == (
            WaitingJob(
                id=job.id,
                task_name="wf.approval",
                waiting_for="event:approved:1",
                run_at=job.run_at,
            ),
        )
        assert await app.emit_event("approved:1", [1, 2])  # runs the job, before it returns
        assert (job.status, job.result) == ("done", [1, 2])
        assert not await app.emit_event("approved:1", "again")  # the first emit won
        await approval.defer(1)  # a wait after the emit returns it at once
        assert (queue.jobs[1].status, queue.jobs[1].result) == ("done", [1, 2])
        await approval.defer(2)
        await drain(app, timeouts=True)
        assert queue.jobs[2].result == "timed out"
    assert ran == ["asked 1", "asked 1", "asked 2"]


async def test_inline_events_wait_for_drain_without_run() -> None:
    with inline(app, run=False) as queue:
        await approval.defer(3)
        assert await app.emit_event("approved:3", "ok")
        assert queue.jobs[0].status == "queued"
        drained = await drain(app)
    assert (drained.done, queue.jobs[0].result) == (1, "ok")


async def test_inline_children_run_after_their_parents_run_and_are_gathered() -> None:
    with inline(app, raise_errors=False) as queue:
        parent_id = await assembly.defer([1, -2, 3])
    parent, *children = queue.jobs
    assert [(c.task_name, c.parent_id, c.status, c.result) for c in children] == [
        ("wf.part", parent_id, "done", 10),
        ("wf.part", parent_id, "failed", None),
        ("wf.part", parent_id, "done", 30),
    ]
    assert (parent.status, parent.result) == ("done", [10, f"ChildFailed {children[1].id}", 30])
    assert ran == ["spawned 3", "spawned 3"]  # the spawn wrote them once
    assert parent.steps[("asyncq.spawn:wf.part", 1)] == [c.id for c in children]
    with inline(app, raise_errors=False) as queue:
        await strict.defer([4, -5])
    assert queue.jobs[0].status == "failed"
    assert isinstance(queue.jobs[0].error, asyncq.ChildFailed)
    assert queue.jobs[0].error.job_id == queue.jobs[2].id


async def test_inline_jobs_after_others_wait_then_run_or_are_cancelled() -> None:
    with inline(app, run=False) as queue:
        first = await callback.defer("first")
        after = await callback.options(after=[first]).defer("second")
        assert [job.status for job in queue.jobs] == ["queued", "waiting"]
        assert queue.jobs[1].waiting_on == [first]
        await drain(app)
    assert [(job.id, job.status) for job in queue.jobs] == [(first, "done"), (after, "done")]
    assert ran == ["first", "second"]
    with inline(app, raise_errors=False) as queue:
        broken = await part.defer(-1)
        cancelled = await callback.options(after=[broken]).defer("never")
        ran_anyway = await callback.options(after=[broken], on_parent_failure="run").defer("ok")
    assert [job.status for job in queue.jobs] == ["failed", "cancelled", "done"]
    assert queue.jobs[1].last_error == f"Cancelled: it runs after job {broken}, which ended failed"
    assert (queue.jobs[1].id, queue.jobs[2].id) == (cancelled, ran_anyway)


async def test_inline_step_tx_needs_the_app_open() -> None:
    with inline(app) as queue, pytest.raises(asyncq.NotInWorkflow, match="open"):
        await booked.defer(1)
    assert queue.jobs[0].status == "queued"  # failed its first attempt
    assert ran == []


async def test_inline_step_tx_commits_its_sql_on_the_apps_pool(
    asyncq_test_app: asyncq.App,
) -> None:
    async with asyncq_test_app.pool.connection() as conn:  # the test database's own table
        await conn.execute("CREATE TABLE IF NOT EXISTS testing_ledger (order_id int)")
        await conn.execute("TRUNCATE testing_ledger")
    with inline(app, raise_errors=False) as queue:
        await booked.defer(7)
        await drain(app)
    assert (queue.jobs[0].status, queue.jobs[0].attempts, queue.jobs[0].result) == ("done", 2, 7)
    assert ran == ["book 7"]
    async with asyncq_test_app.pool.connection() as conn:
        cur = await conn.execute("SELECT order_id FROM testing_ledger")
        assert await cur.fetchall() == [(7,)]
