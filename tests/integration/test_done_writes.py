"""The writes that follow a claim on every job (done outcomes, in their own statement or
in the next claim's, and the heartbeat) find their rows by id and read each row's claim
at its id's place in the sorted arrays: whatever the statistics say, and whatever order
the outcomes came in, an id given twice included."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.job import Job
from asyncq.store import _fence

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)


async def test_the_writes_look_their_rows_up_by_id_where_statistics_saw_none_running(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    # A small table analysed while every row was queued: the planner expects no running
    # row, and a join to the arrays was planned as a scan of the table with the arrays
    # rescanned for each running row (a cost that grew with the square of the batch).
    db.execute(
        "INSERT INTO asyncq_jobs (task_name) SELECT 'plan.noop' FROM generate_series(1, 3000)"
    )
    db.execute("ANALYZE asyncq_jobs")
    store, worker = app.store, "host:1:plan"
    async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
        jobs = await store.claim(conn, worker=worker, limit=100, queues=None, lease=LEASE)
        assert len(jobs) == 100
        results = ['{"n": 1}'] * len(jobs)
        statements = {
            "mark_done": _fence(worker, jobs),
            "mark_done_results": _fence(worker, jobs, results=results),
            "heartbeat": _fence(worker, jobs),
            "claim_writing_done": {
                **_fence(worker, jobs),
                "limit": 10,
                "lease": LEASE,
                "queues": None,
            },
        }
        for name, params in statements.items():
            cur = await conn.execute("EXPLAIN " + store.q[name], params)  # type: ignore[operator]
            plan = "\n".join(str(row[0]) for row in await cur.fetchall())
            assert "Index Scan using asyncq_jobs_pkey" in plan, f"{name}:\n{plan}"
            assert "Seq Scan on asyncq_jobs" not in plan, f"{name}:\n{plan}"


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
