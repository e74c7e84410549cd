"""The writes that follow a claim on every job (done outcomes, in their own statement or
in the next claim's, and the heartbeat) find their rows by id and read each row's claim
at its id's place in the sorted arrays, whatever order the outcomes came in, an id given
twice included. (Their plans, whatever the statistics: test_pinned_plans.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.job import Job

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)


async def test_each_row_is_written_by_its_own_claim_whatever_order_the_outcomes_came_in(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="order.noop")
    async def noop() -> None:
        pass

    store, worker = app.store, "host:1:order"
    for _ in range(6):
        await noop.defer()
    async with app.pool.connection() as conn:
        jobs = await store.claim(conn, worker=worker, limit=6, queues=None, lease=LEASE)
        assert len(jobs) == 6
        # The first job claimed again here (its lease lost while this worker was frozen,
        # say): the worker holds two outcomes of it, the earlier claim's and the later's.
        again = jobs[0]
        db.execute("UPDATE asyncq_jobs SET claims = claims + 1 WHERE id = %s", (again.id,))
        later = again._replace(claim=again.claim + 1)

        # Ids descending, the later claim first: nothing in the order written.
        shuffled: list[Job] = [later, jobs[2], jobs[1], again]
        beaten = await store.heartbeat(conn, worker=worker, jobs=shuffled)
        assert set(beaten) == {again.id, jobs[1].id, jobs[2].id}
        # Ids ascending, but the later claim first.
        written = await store.mark_done(conn, worker=worker, jobs=[later, again, *jobs[1:3]])
        assert written == {again.id, jobs[1].id, jobs[2].id}
        claimed, count = await store.claim_writing_done(
            conn, worker=worker, limit=10, queues=None, lease=LEASE, done=list(reversed(jobs[3:]))
        )
        assert (claimed, count) == ([], 3)
    rows = db.execute("SELECT status::text FROM asyncq_jobs ORDER BY id").fetchall()
    assert rows == [("done",)] * 6


def test_the_done_write_wakes_the_waiter_of_the_last_job_it_ends(
    db: psycopg.Connection[Any],
) -> None:
    """A job waited for and written done with nothing to store: its edge goes in the
    statement that ends it, and its waiter is woken when it was the last (migration 0027:
    one statement that ends the jobs, returns their ids and releases their waiters)."""
    db.execute(
        "INSERT INTO asyncq_jobs (id, task_name, status, waiting_for, run_at)"
        " VALUES (1, 'parent', 'waiting', 'jobs', 'infinity')"
    )
    db.execute(
        "INSERT INTO asyncq_jobs (id, task_name, status, locked_by, claims, attempts, lease,"
        " locked_at, expires_at, parent_id, awaited)"
        " SELECT g, 'child', 'running', 'w', 1, 1, '30 s', now(), now() + interval '30 s',"
        " 1, true FROM generate_series(2, 3) AS g"
    )
    db.execute("INSERT INTO asyncq_waits (on_id, job_id) VALUES (2, 1), (3, 1)")

    def state() -> tuple[object, ...]:
        row = db.execute(
            "SELECT (SELECT status::text FROM asyncq_jobs WHERE id = 1),"
            " (SELECT array_agg(on_id ORDER BY on_id) FROM asyncq_waits)"
        ).fetchone()
        assert row is not None
        return row

    ended = db.execute("SELECT * FROM asyncq_mark_done('w', '{2}', '{1}')").fetchall()
    assert ended == [(2,)]
    assert state() == ("waiting", [3])
    ended = db.execute("SELECT * FROM asyncq_mark_done('w', '{3}', '{1}')").fetchall()
    assert ended == [(3,)]
    assert state() == ("queued", None)
