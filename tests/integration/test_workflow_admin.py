"""What `asyncq.admin` reads and does for work that spans jobs, on rows written as the
workers write them: a job that waits with no time to come due (run_at 'infinity') is
listed and shown; long lists are cut at `admin.SHOWN` with their totals; a retry that
would take a unique key a live job holds is refused with a clear error."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import asyncq
from asyncq import admin

pytestmark = pytest.mark.anyio


def insert(db: psycopg.Connection[Any], **columns: Any) -> int:
    names = ", ".join(["task_name", *columns])
    values = ", ".join(["'t'"] + ["%s"] * len(columns))
    row = db.execute(
        f"INSERT INTO asyncq_jobs ({names}) VALUES ({values}) RETURNING id",  # type: ignore[arg-type]
        list(columns.values()),
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_job_that_waits_with_no_time_is_listed_and_shown(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    waits = insert(db, status="waiting", run_at="infinity", waiting_for="event:paid")
    # A cancel leaves the run_at of a job that waited as it was.
    cancelled = insert(db, status="cancelled", run_at="infinity", finished_at="now")
    async with app.pool.connection() as conn:
        for status in (None, "waiting", "cancelled"):
            listed = {j.id: j for j in await admin.jobs(conn, app.store, status=status)}
            assert {i: listed[i].run_at for i in listed} == {i: None for i in listed}, status
        [waiting] = await admin.jobs(conn, app.store, status="waiting")
        assert (waiting.id, waiting.waiting_for) == (waits, "event:paid")
        found = await admin.job(conn, app.store, waits)
        assert found is not None and found.run_at is None
        assert found.waiting_for == admin.WaitingFor("event", until=None, key="paid")
        shown = await admin.job(conn, app.store, cancelled)
        assert shown is not None and shown.run_at is None and shown.waiting_for is None


async def test_long_lists_are_cut_with_their_totals(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    many = admin.SHOWN + 5
    parent = insert(db, status="waiting", run_at="infinity", waiting_for="jobs")
    db.execute(
        "INSERT INTO asyncq_steps (job_id, name, seq, result, attempt, claim, started_at)"
        " SELECT %s, 'item', g, '1', 1, 1, now() FROM generate_series(1, %s) AS g",
        (parent, many),
    )
    db.execute(
        "INSERT INTO asyncq_steps (job_id, name, seq, result, attempt, claim, started_at)"
        " VALUES (%s, 'last', 1, '[1, 2]', 1, 1, NULL)",
        (parent,),
    )
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, parent_id, status, awaited)"
        " SELECT 'child', %s, CASE WHEN g %% 2 = 0 THEN 'done' ELSE 'queued' END"
        "        ::asyncq_job_status, true"
        "   FROM generate_series(1, %s) AS g",
        (parent, many),
    )
    db.execute(
        "INSERT INTO asyncq_waits (on_id, job_id)"
        " SELECT id, %s FROM asyncq_jobs WHERE parent_id = %s AND status = 'queued'",
        (parent, parent),
    )
    children = [
        r[0]
        for r in db.execute(
            "SELECT id FROM asyncq_jobs WHERE parent_id = %s ORDER BY id", (parent,)
        )
    ]
    async with app.pool.connection() as conn:
        found = await admin.job(conn, app.store, parent)
    assert found is not None
    assert len(found.steps) == admin.SHOWN and found.steps_total == many + 1
    assert found.step_names == ["item", "last"]  # every name, those not shown too
    assert [s.seq for s in found.steps] == list(range(1, admin.SHOWN + 1))
    assert found.children.total == many
    assert found.children.by_status == {"done": many // 2, "queued": many - many // 2}
    assert [c.id for c in found.children.jobs] == children[: admin.SHOWN]
    awaited = children[::2]  # the queued ones: the odd numbers of the series
    assert found.waiting_for == admin.WaitingFor(
        "jobs", ids=awaited[: admin.SHOWN], remaining=len(awaited)
    )


async def test_a_step_with_no_start_has_no_duration(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    job = insert(db, status="done", finished_at="now")
    db.execute(
        "INSERT INTO asyncq_steps (job_id, name, seq, result, attempt, claim, started_at)"
        " VALUES (%s, 'a', 1, '\"x\"', 2, 3, now() - interval '1500 ms'),"
        "        (%s, 'b', 1, '[1, 2]', 2, 3, NULL)",
        (job, job),
    )
    async with app.pool.connection() as conn:
        found = await admin.job(conn, app.store, job)
    assert found is not None
    a, b = found.steps
    assert (a.name, a.seq, a.status, a.attempt, a.result_bytes) == ("a", 1, "done", 2, 3)
    assert a.duration_seconds is not None and a.duration_seconds >= 1.5
    assert (b.started_at, b.duration_seconds, b.result_bytes) == (None, None, len("[1, 2]"))


async def test_a_retry_that_would_take_a_held_unique_key_is_refused(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    failed = insert(db, status="failed", unique_key="report-7", finished_at="now")
    insert(db, status="queued", unique_key="report-7")
    with pytest.raises(ValueError, match=f"job {failed} cannot run again while a live job"):
        await app.retry(failed)
    row = db.execute("SELECT status::text FROM asyncq_jobs WHERE id = %s", (failed,)).fetchone()
    assert row == ("failed",)
