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
