"""Work that spans jobs, run by a real worker: steps that run once, durable sleeps and
waits that free the worker's slot, events, children and their gather, dependencies,
retries from a step, cancels that reach children, and writes fenced by the claim."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq import current_job

pytestmark = pytest.mark.anyio

FAST = asyncq.Backoff(base=0.01, cap=0.02)
WAIT = 20.0


@pytest.fixture
async def worker(app: asyncq.App) -> AsyncIterator[Callable[..., None]]:
    """Start a worker on ``app`` (call it, with run_worker's options); stopped at the end."""
    async with anyio.create_task_group() as tg:

        def start(**options: Any) -> None:
            options.setdefault("concurrency", 20)
            tg.start_soon(lambda: app.run_worker(handle_signals=False, **options))

        yield start
        tg.cancel_scope.cancel()


def rows(db: psycopg.Connection[Any], query: str, *params: Any) -> list[tuple[Any, ...]]:
    return db.execute(query, params).fetchall()


def status_of(db: psycopg.Connection[Any], job_id: int) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT status::text, attempts, waiting_for, claims FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return row


async def until(predicate: Callable[[], bool], what: str, within: float = WAIT) -> None:
    """Wait until ``predicate()`` holds (``what`` says what that means)."""
    with anyio.fail_after(within):
        while True:
            if predicate():
                return
            await anyio.sleep(0.02)


# -- steps ------------------------------------------------------------------------------


async def test_finished_steps_do_not_run_again_when_the_attempt_fails(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    calls: list[str] = []

    def charge(amount: int) -> dict[str, int]:
        calls.append("charge")
        return {"charged": amount}

    async def reserve() -> list[Any]:
        calls.append("reserve")
        if current_job().attempt == 1:
            raise RuntimeError("the warehouse is down")
        return ["reserved", (1, 2)]

    @app.task(name="wf.order", retry=FAST)
    async def order(amount: int) -> dict[str, Any]:
        ctx = current_job()
        charged = await ctx.step("charge", charge, amount)
        reserved = await ctx.step("reserve", reserve)
        return {"charged": charged, "reserved": reserved}

    job_id = await order.defer(5)
    worker()
    result = await app.result(job_id, timeout=WAIT)
    # What a step returns is its JSON, the same in every run: the tuple reads as a list.
    assert result == {"charged": {"charged": 5}, "reserved": ["reserved", [1, 2]]}
    assert calls == ["charge", "reserve", "reserve"]
    steps = rows(
        db,
        "SELECT name, seq, result, attempt FROM asyncq_steps WHERE job_id = %s ORDER BY position",
        job_id,
    )
    assert steps == [
        ("charge", 1, {"charged": 5}, 1),
        ("reserve", 1, ["reserved", [1, 2]], 2),
    ]


async def test_steps_are_keyed_by_name_and_order_within_a_name(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    """A second run calls its steps in another order (code changed between deploys): each
    name's n-th call still gets the n-th result stored under that name."""
    calls: list[str] = []

    def made(what: str) -> Callable[[], str]:
        def make() -> str:
            calls.append(what)
            return what

        return make

    @app.task(name="wf.reordered", retry=FAST)
    async def reordered() -> list[str]:
        ctx = current_job()
        if ctx.attempt == 1:
            first = await ctx.step("a", made("a1"))
            second = await ctx.step("a", made("a2"))
            third = await ctx.step("b", made("b1"))
            raise RuntimeError("deploy")
        third = await ctx.step("b", made("b-new"))
        first = await ctx.step("a", made("a-new"))
        second = await ctx.step("a", made("a2-new"))
        fourth = await ctx.step("a", made("a3"))
        return [first, second, third, fourth]

    job_id = await reordered.defer()
    worker()
    assert await app.result(job_id, timeout=WAIT) == ["a1", "a2", "b1", "a3"]
    assert calls == ["a1", "a2", "b1", "a3"]


async def test_steps_of_many_jobs_keep_names_and_results_that_need_quoting(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    """The checkpoints of many jobs go in one statement, their names and results in arrays:
    quotes, backslashes, braces, commas and spaces come back as they went."""
    names = ['say "hi"', "back\\slash", "{braced}, with a comma", " spaced ", "NULL", "é"]

    @app.task(name="wf.quoted", retry=FAST)
    async def quoted(n: int) -> list[Any]:
        ctx = current_job()
        found = [await ctx.step(name, lambda name=name: {name: [name, n]}) for name in names]
        if ctx.attempt == 1:
            raise RuntimeError("run again: the results come from the checkpoints")
        return found

    ids = await quoted.defer_many([{"n": n} for n in range(20)])
    worker()
    for n, job_id in enumerate(ids):
        assert await app.result(job_id, timeout=WAIT) == [{name: [name, n]} for name in names]
    stored = rows(db, "SELECT name, result FROM asyncq_steps WHERE job_id = %s", ids[0])
    assert sorted(stored) == sorted((name, {name: [name, 0]}) for name in names)


async def test_a_step_whose_result_is_not_json_fails_the_attempt_with_a_clear_error(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    @app.task(name="wf.unstorable", max_attempts=1)
    async def unstorable() -> None:
        await current_job().step("sets", lambda: {1, 2})

    @app.task(name="wf.huge", max_attempts=1)
    async def huge() -> None:
        await current_job().step("big", lambda: "x" * (2 * 1024 * 1024))

    bad, big = await unstorable.defer(), await huge.defer()
    worker()
    with pytest.raises(asyncq.JobFailed) as failed:
        await app.result(bad, timeout=WAIT)
    assert "result of step 'sets'" in str(failed.value.last_error)
    assert "JSON" in str(failed.value.last_error)
    with pytest.raises(asyncq.JobFailed) as failed:
        await app.result(big, timeout=WAIT)
    assert "the cap of step results" in str(failed.value.last_error)
    assert rows(db, "SELECT count(*) FROM asyncq_steps") == [(0,)]


async def test_step_tx_commits_its_sql_with_its_checkpoint_once(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS wf_ledger (order_id int, amount int)")
    db.execute("TRUNCATE wf_ledger")
    runs: list[int] = []

    async def book(conn: psycopg.AsyncConnection[Any], order_id: int) -> int:
        runs.append(order_id)
        await conn.execute("INSERT INTO wf_ledger VALUES (%s, 10)", (order_id,))
        return order_id * 10

    @app.task(name="wf.booked", retry=FAST)
    async def booked(order_id: int) -> int:
        ctx = current_job()
        total = await ctx.step_tx("book", book, order_id)
        if ctx.attempt == 1:
            raise RuntimeError("after the booking")
        return int(total)

    job_id = await booked.defer(7)
    worker()
    assert await app.result(job_id, timeout=WAIT) == 70
    assert runs == [7]
    assert rows(db, "SELECT order_id, amount FROM wf_ledger") == [(7, 10)]


async def test_step_tx_rolls_back_its_sql_when_the_job_is_no_longer_this_attempts(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    """Another worker claims the job while the step runs (its lease ran out): the step's
    own statements roll back with the refused checkpoint, and the attempt ends, writing
    nothing more."""
    db.execute("CREATE TABLE IF NOT EXISTS wf_fenced (note text)")
    db.execute("TRUNCATE wf_fenced")
    ended = anyio.Event()

    async def book(conn: psycopg.AsyncConnection[Any]) -> str:
        await conn.execute("INSERT INTO wf_fenced VALUES ('booked')")
        db.execute(  # the rescuer and another worker, in between
            "UPDATE asyncq_jobs SET claims = claims + 1, locked_by = 'another-worker'"
            " WHERE id = %s",
            (current_job().id,),
        )
        return "booked"

    @app.task(name="wf.stolen")
    async def stolen() -> None:
        try:
            await current_job().step_tx("book", book)
        finally:
            ended.set()
        raise AssertionError("not reached: the attempt ends at the refused checkpoint")

    job_id = await stolen.defer()
    worker()
    with anyio.fail_after(WAIT):
        await ended.wait()
    await anyio.sleep(0.2)  # the attempt unwinds; nothing more is written
    assert rows(db, "SELECT count(*) FROM wf_fenced") == [(0,)]
    assert rows(db, "SELECT count(*) FROM asyncq_steps") == [(0,)]
    assert status_of(db, job_id)[0] == "running"  # another worker's now, untouched


# -- durable sleeps and events ------------------------------------------------------------


async def test_a_sleep_frees_the_slot_and_resumes_after_the_steps(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    calls: list[str] = []
    slept = anyio.Event()

    @app.task(name="wf.sleeper")
    async def sleeper() -> str:
        ctx = current_job()
        await ctx.step("before", lambda: calls.append("before"))
        slept.set()
        await ctx.sleep(timedelta(seconds=2))
        await ctx.step("after", lambda: calls.append("after"))
        return "woke"

    @app.task(name="wf.other")
    async def other(sleeper_id: int) -> str:
        # Run on the one slot: the sleeper holds it no more.
        return str(status_of(db, sleeper_id)[0])

    job_id = await sleeper.defer()
    worker(concurrency=1)
    await slept.wait()
    await until(lambda: status_of(db, job_id)[0] == "waiting", "the sleeper waits")
    _, attempts, waiting_for, _ = status_of(db, job_id)
    assert (attempts, waiting_for) == (0, "sleep")  # the attempt does not count
    # Its one slot is free: another job runs while it sleeps.
    assert await app.result(await other.defer(job_id), timeout=WAIT) == "waiting"
    assert await app.result(job_id, timeout=WAIT) == "woke"
    assert calls == ["before", "after"]
    assert status_of(db, job_id)[:2] == ("done", 1)


async def test_an_event_wakes_its_waiter_and_is_kept_for_later_waits(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    @app.task(name="wf.waiter")
    async def waiter(key: str) -> Any:
        return await current_job().wait_for_event(key)

    first = await waiter.defer("order-1.paid")
    worker()
    await until(lambda: status_of(db, first)[0] == "waiting", "the waiter waits")
    assert status_of(db, first)[2] == "event:order-1.paid"
    assert await app.emit_event("order-1.paid", {"amount": 12}) is True
    assert await app.emit_event("order-1.paid", {"amount": 99}) is False  # the first wins
    assert await app.result(first, timeout=WAIT) == {"amount": 12}
    # A wait that starts after the emit returns at once: no suspension.
    later = await waiter.defer("order-1.paid")
    assert await app.result(later, timeout=WAIT) == {"amount": 12}
    assert status_of(db, later)[:2] == ("done", 1)
    assert status_of(db, later)[3] == 1  # claimed once


async def test_an_emit_in_a_rolled_back_transaction_wakes_nobody(
    app: asyncq.App, db: Any, worker: Any, dsn: str
) -> None:
    @app.task(name="wf.tx_waiter")
    async def waiter() -> Any:
        return await current_job().wait_for_event("tx-key")

    job_id = await waiter.defer()
    worker()
    await until(lambda: status_of(db, job_id)[0] == "waiting", "the waiter waits")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        assert await app.emit_event("tx-key", 1, conn=conn) is True
        await conn.rollback()
    assert rows(db, "SELECT count(*) FROM asyncq_events") == [(0,)]
    assert status_of(db, job_id)[0] == "waiting"
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        assert await app.emit_event("tx-key", 2, conn=conn) is True
        await conn.commit()
    assert await app.result(job_id, timeout=WAIT) == 2


async def test_a_wait_past_its_timeout_raises_event_timeout(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    @app.task(name="wf.impatient", max_attempts=1)
    async def impatient() -> str:
        try:
            await current_job().wait_for_event("never", timeout=0.5)
        except asyncq.EventTimeout as exc:
            return f"gave up on {exc.key}"
        return "came"

    job_id = await impatient.defer()
    worker()
    assert await app.result(job_id, timeout=WAIT) == "gave up on never"


# -- children ---------------------------------------------------------------------------


async def test_children_are_gathered_in_order_and_spawned_once(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    @app.task(name="wf.square")
    async def square(n: int) -> int:
        return n * n

    @app.task(name="wf.fan", retry=FAST)
    async def fan(n: int) -> int:
        ctx = current_job()
        ids = await ctx.spawn_many(square, [{"n": i} for i in range(n)])
        one = await ctx.spawn(square, 10)
        if ctx.attempt == 1:
            raise RuntimeError("after spawning")
        return sum(await ctx.gather([*ids, one]))

    job_id = await fan.defer(20)
    worker()
    assert await app.result(job_id, timeout=WAIT) == sum(i * i for i in range(20)) + 100
    assert rows(db, "SELECT count(*) FROM asyncq_jobs WHERE parent_id = %s", job_id) == [(21,)]


async def test_a_gather_of_some_children_does_not_wait_for_the_others(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    """A spawn makes the edge to each child: a gather drops those to the children it does
    not wait for (here one that waits for an event which the parent emits only once its
    first gather has returned), and waits again for them only when it gathers them."""

    @app.task(name="wf.quick")
    async def quick(n: int) -> int:
        return n

    @app.task(name="wf.slow")
    async def slow(key: str) -> Any:
        return await current_job().wait_for_event(key)

    @app.task(name="wf.some")
    async def some() -> Any:
        ctx = current_job()
        slow_id = await ctx.spawn(slow, "wf.some.go")
        ids = await ctx.spawn_many(quick, [{"n": i} for i in range(5)])
        first = await ctx.gather(ids[:2])
        await app.emit_event("wf.some.go", "went")
        rest = await ctx.gather([*ids[2:], slow_id])
        return [first, rest]

    job_id = await some.defer()
    worker()
    assert await app.result(job_id, timeout=WAIT) == [[0, 1], [2, 3, 4, "went"]]
    assert rows(db, "SELECT count(*) FROM asyncq_waits") == [(0,)]


async def test_a_failed_child_reaches_gather_as_child_failed(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    @app.task(name="wf.flaky_child", max_attempts=1)
    async def flaky_child(n: int) -> int:
        if n == 2:
            raise ValueError("bad input 2")
        return n

    @app.task(name="wf.strict", max_attempts=1)
    async def strict() -> Any:
        ctx = current_job()
        ids = await ctx.spawn_many(flaky_child, [{"n": i} for i in range(4)])
        try:
            await ctx.gather(ids)
        except asyncq.ChildFailed as exc:
            return {"failed": exc.job_id == ids[2], "error": "bad input 2" in str(exc.last_error)}
        return "no error"

    @app.task(name="wf.lenient", max_attempts=1)
    async def lenient() -> Any:
        ctx = current_job()
        ids = await ctx.spawn_many(flaky_child, [{"n": i} for i in range(4)])
        got = await ctx.gather(ids, return_exceptions=True)
        return [x if isinstance(x, int) else type(x).__name__ for x in got]

    first, second = await strict.defer(), await lenient.defer()
    worker()
    assert await app.result(first, timeout=WAIT) == {"failed": True, "error": True}
    assert await app.result(second, timeout=WAIT) == [0, 1, "ChildFailed", 3]


async def test_spawn_refuses_the_options_a_child_cannot_have(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    """A child is written ready, with its options' queue, priority and max_attempts: a
    delay, a group or dependencies would be dropped, so they are refused."""

    @app.task(name="wf.kid")
    async def kid() -> None:
        pass

    @app.task(name="wf.picky", max_attempts=1)
    async def picky(option: str) -> None:
        given: dict[str, Any] = {
            "delay": {"delay": 60},
            "run_at": {"run_at": datetime.now(UTC) + timedelta(minutes=1)},
            "group": {"group": "tenant-1"},
            "after": {"after": [current_job().id]},
        }[option]
        await current_job().spawn(kid.options(**given))

    @app.task(name="wf.queued_kid")
    async def queued_kid() -> int:
        return await current_job().spawn(kid.options(queue="other", priority=5))

    refused = {
        option: await picky.defer(option) for option in ("delay", "run_at", "group", "after")
    }
    allowed = await queued_kid.defer()
    worker()
    for option, job_id in refused.items():
        with pytest.raises(asyncq.JobFailed) as failed:
            await app.result(job_id, timeout=WAIT)
        assert f"options({option}=) do not apply to ctx.spawn" in str(failed.value.last_error)
    child = await app.result(allowed, timeout=WAIT)
    assert rows(db, "SELECT queue, priority FROM asyncq_jobs WHERE id = %s", child) == [
        ("other", 5)
    ]
    assert rows(db, "SELECT count(*) FROM asyncq_jobs WHERE task_name = 'wf.kid'") == [(1,)]


async def test_cancelling_a_parent_cancels_its_unfinished_children(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    @app.task(name="wf.blocked_child")
    async def blocked_child() -> Any:
        return await current_job().wait_for_event("never-comes")

    @app.task(name="wf.parent")
    async def parent() -> Any:
        ctx = current_job()
        ids = await ctx.spawn_many(blocked_child, [{}, {}, {}])
        return await ctx.gather(ids)

    job_id = await parent.defer()
    worker()
    await until(lambda: status_of(db, job_id)[0] == "waiting", "the parent waits")
    await until(
        lambda: (
            rows(
                db,
                "SELECT count(*) FROM asyncq_jobs WHERE parent_id = %s AND status = 'waiting'",
                job_id,
            )
            == [(3,)]
        ),
        "the children wait",
    )
    assert (await app.cancel(job_id)) == {job_id: "cancelled"}
    children = rows(
        db, "SELECT status::text, last_error FROM asyncq_jobs WHERE parent_id = %s", job_id
    )
    assert [c[0] for c in children] == ["cancelled"] * 3
    assert all(f"job {job_id}" in c[1] for c in children)
    assert rows(db, "SELECT count(*) FROM asyncq_waits") == [(0,)]


# -- dependencies and batches -------------------------------------------------------------


async def test_a_job_after_others_runs_when_they_are_done_and_is_cancelled_otherwise(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    gate = anyio.Event()

    @app.task(name="wf.part", max_attempts=1)
    async def part(n: int) -> int:
        await gate.wait()
        if n < 0:
            raise ValueError("negative")
        return n

    @app.task(name="wf.callback")
    async def callback(ids: list[int]) -> Any:
        return [await app.result(i) if i > 0 else None for i in ids]

    good = [await part.defer(n) for n in (1, 2)]
    bad = await part.defer(-1)
    after_good = await callback.options(after=good).defer(good)
    after_bad = await callback.options(after=[good[0], bad]).defer([])
    run_anyway = await callback.options(after=[bad], on_parent_failure="run").defer([])
    for job_id in (after_good, after_bad, run_anyway):
        assert status_of(db, job_id)[0] == "waiting"
    worker()
    await anyio.sleep(0.2)
    assert status_of(db, after_good)[0] == "waiting"  # never claimed while they run
    gate.set()
    assert await app.result(after_good, timeout=WAIT) == [1, 2]
    assert await app.result(run_anyway, timeout=WAIT) == []
    with pytest.raises(asyncq.JobCancelled) as cancelled:
        await app.result(after_bad, timeout=WAIT)
    assert f"job {bad}, which ended failed" in str(cancelled.value.last_error)
    # After jobs that ended already: decided at once.
    done_now = await callback.options(after=good).defer([])
    failed_now = await callback.options(after=[bad]).defer([])
    assert status_of(db, done_now)[0] in ("queued", "running", "done")
    assert status_of(db, failed_now)[0] == "cancelled"


async def test_after_refuses_what_it_cannot_honour(app: asyncq.App) -> None:
    @app.task(name="wf.dep")
    async def dep() -> None:
        pass

    with pytest.raises(ValueError, match="cannot be combined with delay"):
        dep.options(after=[1], delay=5)
    with pytest.raises(ValueError, match="on_parent_failure"):
        dep.options(after=[1], on_parent_failure="maybe")
    with pytest.raises(TypeError):
        dep.options(after=["1"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at least one"):
        dep.options(after=[])


# -- steering ---------------------------------------------------------------------------


async def test_retry_from_a_step_runs_it_and_the_later_ones_again(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    calls: list[str] = []

    @app.task(name="wf.three")
    async def three() -> list[str]:
        ctx = current_job()
        out = []
        for name in ("a", "b", "c"):
            out.append(await ctx.step(name, lambda n=name: calls.append(n) or n))
        return out

    job_id = await three.defer()
    worker()
    assert await app.result(job_id, timeout=WAIT) == ["a", "b", "c"]
    assert await app.retry(job_id, from_step="b") == "done"
    await until(lambda: calls == ["a", "b", "c", "b", "c"], "b and c ran again")
    with pytest.raises(ValueError, match="no step named"):
        await app.retry(job_id, from_step="nope")
    with pytest.raises(asyncq.JobNotFound):
        await app.retry(10**9)


async def test_a_plain_def_task_is_told_it_cannot_use_workflows(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    @app.task(name="wf.sync_step", max_attempts=1)
    def sync_step() -> None:
        import asyncio

        asyncio.run(current_job().step("s", lambda: 1))

    job_id = await sync_step.defer()
    worker()
    with pytest.raises(asyncq.JobFailed) as failed:
        await app.result(job_id, timeout=WAIT)
    assert "needs an async def task" in str(failed.value.last_error)


async def test_waiting_jobs_are_never_claimed(app: asyncq.App, db: Any) -> None:
    @app.task(name="wf.parked")
    async def parked() -> None:
        pass

    first = await parked.defer()
    await parked.options(after=[first]).defer()
    async with app.pool.connection() as conn:
        claimed = await app.store.claim(
            conn, worker="w", limit=10, queues=None, lease=timedelta(seconds=30)
        )
    assert [j.id for j in claimed] == [first]
    assert rows(db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'waiting'") == [(1,)]


async def test_a_failed_steps_traceback_holds_the_tasks_frames_not_asyncqs(
    app: asyncq.App, db: Any, worker: Any
) -> None:
    def explode() -> None:
        raise ValueError("the step's own error")

    @app.task(name="wf.explodes", max_attempts=1)
    async def explodes() -> None:
        await current_job().step("boom", explode)

    job_id = await explodes.defer()
    worker()
    with pytest.raises(asyncq.JobFailed) as failed:
        await app.result(job_id, timeout=WAIT)
    error = str(failed.value.last_error)
    assert "in explode" in error and "in explodes" in error
    assert "asyncq/workflow.py" not in error and "asyncq/job.py" not in error
