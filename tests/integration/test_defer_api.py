"""Writing jobs: defer, defer_many, direct calls and every option of task.options()."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import asyncq

pytestmark = pytest.mark.anyio

CONTRACT_COLUMNS = {
    "id": "bigint",
    "task_name": "text",
    "queue": "text",
    "args": "jsonb",
    "status": "USER-DEFINED",
    "priority": "integer",
    "run_at": "timestamp with time zone",
    "attempts": "integer",
    "max_attempts": "integer",
    "locked_by": "text",
    "locked_at": "timestamp with time zone",
    "last_error": "text",
    "created_at": "timestamp with time zone",
    "finished_at": "timestamp with time zone",
}


def row_of(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    cur = db.execute("SELECT * FROM asyncq_jobs WHERE id = %s", (job_id,))
    row = cur.fetchone()
    assert row is not None, f"no row for job {job_id}"
    assert cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


async def test_table_has_the_contract_columns(app: asyncq.App, db: Any) -> None:
    rows = db.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_name = 'asyncq_jobs' AND table_schema = current_schema()"
    ).fetchall()
    types = dict(rows)
    for column, data_type in CONTRACT_COLUMNS.items():
        assert types.get(column) == data_type, column
    statuses = db.execute("SELECT enum_range(NULL::asyncq_job_status)::text[]").fetchone()[0]
    assert set(statuses) == {"queued", "running", "waiting", "done", "failed", "cancelled"}


async def test_defer_returns_id_and_writes_a_queued_row(app: asyncq.App, db: Any) -> None:
    @app.task
    async def send(to: str, count: int, *, loud: bool = False) -> None:
        raise AssertionError("not run in this test")

    job_id = await send.defer("ann@example.com", 2, loud=True)
    assert isinstance(job_id, int)
    row = row_of(db, job_id)
    assert row["task_name"] == send.name
    assert send.name == f"{__name__}.test_defer_returns_id_and_writes_a_queued_row.<locals>.send"
    assert row["queue"] == "default"
    assert row["status"] == "queued"
    assert row["attempts"] == 0
    assert row["max_attempts"] == 3
    assert row["priority"] == 0
    # Positional arguments are stored under their parameter names.
    assert row["args"] == {"to": "ann@example.com", "count": 2, "loud": True}
    assert row["locked_by"] is None and row["locked_at"] is None
    assert row["last_error"] is None and row["finished_at"] is None
    now = db.execute("SELECT now()").fetchone()[0]
    assert row["created_at"] <= now
    assert abs((row["run_at"] - row["created_at"]).total_seconds()) < 1

    second = await send.defer(to="bob@example.com", count=0)
    assert second > job_id
    assert row_of(db, second)["args"] == {"to": "bob@example.com", "count": 0}


async def test_task_decorator_options_become_row_defaults(app: asyncq.App, db: Any) -> None:
    @app.task(queue="mail", max_attempts=7, priority=4, name="mail.send")
    async def send(to: str) -> None:
        pass

    assert send.name == "mail.send"
    row = row_of(db, await send.defer("x"))
    assert (row["task_name"], row["queue"], row["max_attempts"], row["priority"]) == (
        "mail.send",
        "mail",
        7,
        4,
    )


async def test_argument_shapes_round_trip_to_the_function(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    seen: list[Any] = []

    @app.task
    async def shapes(a: int, /, b: str, *rest: int, c: Any = None, **extra: Any) -> None:
        seen.append((a, b, rest, c, extra))

    payload = {"nested": [1, 2.5, None, True], "text": "é \"'\\ 🙂"}
    job_id = await shapes.defer(1, "two", 3, 4, c=payload, z=False)
    args = row_of(db, job_id)["args"]
    assert args == {"a": 1, "b": "two", "rest": [3, 4], "c": payload, "z": False}
    await drain()
    assert seen == [(1, "two", (3, 4), payload, {"z": False})]
    assert row_of(db, job_id)["status"] == "done"


async def test_defer_many_writes_rows_in_one_statement_in_order(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    seen: list[int] = []

    @app.task
    async def square(n: int) -> None:
        seen.append(n * n)

    ids = await square.defer_many([{"n": n} for n in range(50)])
    assert len(ids) == 50
    assert ids == sorted(ids) and len(set(ids)) == 50
    rows = db.execute(
        "SELECT id, args, status::text, created_at FROM asyncq_jobs ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == ids
    assert [r[1] for r in rows] == [{"n": n} for n in range(50)]
    assert {r[2] for r in rows} == {"queued"}
    # One transaction: every row carries the same transaction timestamp.
    assert len({r[3] for r in rows}) == 1
    assert await square.defer_many([]) == []

    options_ids = await square.options(queue="other", priority=3).defer_many([{"n": 7}])
    row = row_of(db, options_ids[0])
    assert (row["queue"], row["priority"], row["args"]) == ("other", 3, {"n": 7})

    await drain()
    assert sorted(seen) == sorted(n * n for n in [*range(50), 7])


async def test_defer_many_validates_every_item_before_writing(app: asyncq.App, db: Any) -> None:
    @app.task
    async def square(n: int) -> None:
        pass

    with pytest.raises(TypeError):
        await square.defer_many([{"n": 1}, {"m": 2}])
    with pytest.raises(TypeError):
        await square.defer_many([{"n": 1}, {"n": object()}])
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 0


async def test_calling_the_task_runs_in_process_without_the_queue(app: asyncq.App, db: Any) -> None:
    @app.task
    async def add(a: int, b: int) -> int:
        with pytest.raises(asyncq.NotInJob):
            asyncq.current_job()
        return a + b

    assert await add(2, 3) == 5
    assert await add(a=1, b=1) == 2
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 0


# -- options(conn=...) -----------------------------------------------------------


async def test_conn_option_commits_with_the_callers_transaction(
    app: asyncq.App, dsn: str, db: Any, drain: Any
) -> None:
    ran: list[str] = []

    @app.task
    async def note(text: str) -> None:
        ran.append(text)

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=False) as conn:
        await conn.execute("SELECT 1")  # the caller's transaction is open
        job_id = await note.options(conn=conn).defer("kept")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        # Not visible, and not runnable, before the commit.
        assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 0
        stats = await drain()
        assert stats.claimed == 0 and ran == []
        await conn.commit()

    assert row_of(db, job_id)["status"] == "queued"
    await drain()
    assert ran == ["kept"]


async def test_conn_option_rolls_back_with_the_callers_transaction(
    app: asyncq.App, dsn: str, db: Any
) -> None:
    @app.task
    async def note(text: str) -> None:
        pass

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=False) as conn:
        await conn.execute("CREATE TEMP TABLE caller_work (x int)")
        one = await note.options(conn=conn).defer("dropped")
        many = await note.options(conn=conn).defer_many([{"text": "a"}, {"text": "b"}])
        rows = await (await conn.execute("SELECT count(*) FROM asyncq_jobs")).fetchone()
        assert rows == (3,)  # visible inside the caller's transaction
        assert one < many[0] < many[1]
        await conn.rollback()

    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 0


async def test_conn_option_inside_a_transaction_block(app: asyncq.App, dsn: str, db: Any) -> None:
    @app.task
    async def note(text: str) -> None:
        pass

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        with pytest.raises(ZeroDivisionError):
            async with conn.transaction():
                await note.options(conn=conn).defer("lost")
                raise ZeroDivisionError
        assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 0
        async with conn.transaction():
            kept = await note.options(conn=conn).defer("kept")
    assert row_of(db, kept)["args"] == {"text": "kept"}


# -- delay / run_at --------------------------------------------------------------


async def test_delay_pushes_run_at_and_the_job_is_not_claimed(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    ran: list[int] = []

    @app.task
    async def later(n: int) -> None:
        ran.append(n)

    seconds = await later.options(delay=60).defer(1)
    as_timedelta = await later.options(delay=timedelta(minutes=5)).defer(2)
    fractional = await later.options(delay=30.5).defer(3)
    now_job = await later.options(delay=0).defer(4)
    for job_id, expected in [(seconds, 60), (as_timedelta, 300), (fractional, 30.5)]:
        row = row_of(db, job_id)
        waited = (row["run_at"] - row["created_at"]).total_seconds()
        assert expected - 0.5 <= waited <= expected + 0.5

    stats = await drain()
    assert ran == [4]
    assert stats.claimed == 1
    statuses = dict(db.execute("SELECT id, status::text FROM asyncq_jobs").fetchall())
    assert statuses == {
        seconds: "queued",
        as_timedelta: "queued",
        fractional: "queued",
        now_job: "done",
    }


async def test_run_at_in_the_future_is_not_claimed_in_the_past_is(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    ran: list[str] = []

    @app.task
    async def at(label: str) -> None:
        ran.append(label)

    future = datetime.now(UTC) + timedelta(hours=1)
    future_id = await at.options(run_at=future).defer("future")
    past_id = await at.options(run_at=datetime.now(UTC) - timedelta(hours=1)).defer("past")
    assert row_of(db, future_id)["run_at"] == future

    stats = await drain()
    assert ran == ["past"]
    assert stats.claimed == 1
    assert row_of(db, future_id)["status"] == "queued"
    assert row_of(db, future_id)["attempts"] == 0
    assert row_of(db, past_id)["status"] == "done"


async def test_bad_delay_and_run_at_are_rejected(app: asyncq.App, db: Any) -> None:
    @app.task
    async def at() -> None:
        pass

    with pytest.raises(ValueError, match="aware"):
        await at.options(run_at=datetime.now() + timedelta(hours=1)).defer()
    with pytest.raises(ValueError):
        at.options(delay=1, run_at=datetime.now(UTC))
    with pytest.raises(ValueError):
        at.options(delay=-1)
    with pytest.raises(ValueError):
        at.options(delay=timedelta(seconds=-1))
    for not_finite in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            at.options(delay=not_finite)
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 0


# -- priority and queues ---------------------------------------------------------


async def test_higher_priority_runs_first(app: asyncq.App, db: Any, drain: Any) -> None:
    order: list[str] = []

    @app.task
    async def step(label: str) -> None:
        order.append(label)

    await step.defer("p0-first")
    await step.options(priority=-5).defer("p-5")
    await step.options(priority=10).defer("p10")
    await step.options(priority=5).defer("p5")
    await step.defer("p0-second")
    await step.options(priority=2**31 - 1).defer("max")

    await drain(concurrency=1)
    # Equal priorities keep their order.
    assert order == ["max", "p10", "p5", "p0-first", "p0-second", "p-5"]


async def test_priority_must_be_a_32_bit_int(app: asyncq.App) -> None:
    @app.task
    async def step() -> None:
        pass

    with pytest.raises(ValueError):
        step.options(priority=2**31)
    with pytest.raises(ValueError):
        step.options(priority=1.5)  # type: ignore[arg-type]


async def test_worker_serves_only_its_queues(app: asyncq.App, db: Any, drain: Any) -> None:
    ran: list[str] = []

    @app.task(queue="a")
    async def work(label: str) -> None:
        ran.append(f"{asyncq.current_job().queue}:{label}")

    a_id = await work.defer("one")
    b_id = await work.options(queue="b").defer("two")
    c_id = await work.options(queue="c").defer("three")
    assert row_of(db, b_id)["queue"] == "b"

    stats = await drain(queues=["a"])
    assert ran == ["a:one"]
    assert stats.claimed == 1
    assert row_of(db, b_id)["status"] == "queued" and row_of(db, b_id)["attempts"] == 0

    await drain(queues=["b", "c"])
    assert sorted(ran) == ["a:one", "b:two", "c:three"]
    assert {row_of(db, i)["status"] for i in (a_id, b_id, c_id)} == {"done"}


async def test_worker_queues_as_a_single_string(app: asyncq.App, db: Any, drain: Any) -> None:
    ran: list[str] = []

    @app.task
    async def work(label: str) -> None:
        ran.append(label)

    await work.options(queue="abc").defer("abc")
    await work.options(queue="a").defer("a")
    await drain(queues="abc")
    assert ran == ["abc"]  # the queue "abc", not the queues "a", "b" and "c"


async def test_worker_without_queues_serves_every_queue(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    ran: list[str] = []

    @app.task
    async def work(label: str) -> None:
        ran.append(label)

    for queue in ("x", "y", "default"):
        await work.options(queue=queue).defer(queue)
    await drain()
    assert sorted(ran) == ["default", "x", "y"]


# -- unique_key ------------------------------------------------------------------


async def test_unique_key_while_queued_returns_the_same_job(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    ran: list[int] = []

    @app.task
    async def sync_account(n: int) -> None:
        ran.append(n)

    first = await sync_account.options(unique_key="acct-1").defer(1)
    again = await sync_account.options(unique_key="acct-1").defer(2)
    other = await sync_account.options(unique_key="acct-2").defer(3)
    assert again == first
    assert other != first
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 2
    assert row_of(db, first)["args"] == {"n": 1}  # the second defer wrote nothing

    await drain()
    assert sorted(ran) == [1, 3]
    assert row_of(db, first)["status"] == "done"

    # Once the first is done, the key is free again.
    fresh = await sync_account.options(unique_key="acct-1").defer(4)
    assert fresh not in (first, other)
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 3
    assert row_of(db, fresh)["status"] == "queued"


async def test_unique_key_while_running_returns_the_running_job(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    seen: list[tuple[int, int]] = []

    @app.task
    async def refresh() -> None:
        me = asyncq.current_job().id
        seen.append((me, await refresh.options(unique_key="refresh").defer()))

    job_id = await refresh.options(unique_key="refresh").defer()
    await drain()
    assert seen == [(job_id, job_id)]
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0] == 1


async def test_unique_key_after_failure_writes_a_new_job(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    @app.task(max_attempts=1)
    async def flaky() -> None:
        raise RuntimeError("nope")

    first = await flaky.options(unique_key="k").defer()
    await drain()
    assert row_of(db, first)["status"] == "failed"
    second = await flaky.options(unique_key="k").defer()
    assert second != first


# -- max_attempts ----------------------------------------------------------------


async def test_max_attempts_option_is_stored_and_enforced(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    attempts: list[int] = []

    @app.task(max_attempts=5, retry=asyncq.Backoff(base=0.01, cap=0.02))
    async def fails() -> None:
        attempts.append(asyncq.current_job().attempt)
        raise RuntimeError("always")

    default_id = await fails.defer()
    two_id = await fails.options(max_attempts=2).defer()
    assert row_of(db, default_id)["max_attempts"] == 5
    assert row_of(db, two_id)["max_attempts"] == 2
    with pytest.raises(ValueError):
        fails.options(max_attempts=0)

    final = await settle([default_id, two_id])
    assert final == [(default_id, "failed", 5), (two_id, "failed", 2)]
    assert sorted(attempts) == [1, 1, 2, 2, 3, 4, 5]
