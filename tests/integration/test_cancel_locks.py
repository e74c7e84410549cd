"""A cancel and a worker's writes lock the same rows: neither may deadlock the other.

The cancel locks its jobs in id order. A worker's outcome writes and heartbeats lock
theirs in id order too, whatever order its jobs ended in; and a cancel that loses a
deadlock all the same (to a caller's transaction locking rows its own way) is tried
again, not reported as an error.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq.job import Job
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio

WORKER = "locks-test-worker"


async def claim_two(app: asyncq.App) -> list[Job]:
    @app.task(name="locks.two")
    async def two() -> None:
        pass

    await two.defer_many([{}, {}])
    async with app.pool.connection() as conn:
        jobs = await app.store.claim(
            conn, worker=WORKER, limit=2, queues=None, lease=timedelta(minutes=5)
        )
    assert len(jobs) == 2
    return sorted(jobs)


async def waiting_for_a_lock(db: Any, session: str, value: object) -> None:
    """Until a session of pg_stat_activity where ``session`` holds for ``value`` waits
    for a lock."""
    await until(
        lambda: db.execute(
            f"SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND {session}",
            (value,),
        ).fetchone(),
        what=f"the session where {session!r} holds for {value!r} to wait for a lock",
    )


async def test_outcomes_written_out_of_id_order_do_not_deadlock_a_cancel(
    app: asyncq.App, dsn: str, db: Any
) -> None:
    first, second = await claim_two(app)
    # Jobs of the past, so that the write's plan is that of a real table: a look-up by id
    # for each job in turn (two rows alone would be read in the heap's order).
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue, args, status)"
        " SELECT 'locks.past', 'default', '{}', 'done' FROM generate_series(1, 2000)"
    )
    db.execute("ANALYZE asyncq_jobs")
    answers: dict[str, Any] = {}
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as cancelling,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as writing,
        await psycopg.AsyncConnection.connect(dsn) as holder,
    ):
        # A third session holds the first row: the cancel waits for it holding nothing,
        # then the outcome write of the two, in the order the jobs ended (second, first).
        await holder.execute("SELECT 1 FROM asyncq_jobs WHERE id = %s FOR UPDATE", (first.id,))

        async def cancel() -> None:
            answers["cancel"] = await app.store.cancel(cancelling, ids=[first.id, second.id])

        async def write() -> None:
            answers["write"] = await app.store.mark_done(
                writing, worker=WORKER, jobs=[second, first]
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel)
            await waiting_for_a_lock(db, "pid = %s", cancelling.info.backend_pid)
            tg.start_soon(write)
            await waiting_for_a_lock(db, "pid = %s", writing.info.backend_pid)
            # The cancel takes the first row next. Had the write locked the second row
            # before it came to wait for the first, each would wait for the other.
            await holder.commit()
    assert answers == {
        "cancel": {first.id: "aborting", second.id: "aborting"},
        "write": {first.id, second.id},
    }
    rows = db.execute(
        "SELECT status::text, abort_requested_at IS NOT NULL FROM asyncq_jobs WHERE id = ANY(%s)",
        ([first.id, second.id],),
    ).fetchall()
    assert rows == [("done", True), ("done", True)]


async def test_a_cancel_that_loses_a_deadlock_is_tried_again(
    app: asyncq.App, dsn: str, db: Any
) -> None:
    first, second = await claim_two(app)
    answers: dict[int, str] = {}
    async with await psycopg.AsyncConnection.connect(dsn) as other:
        # Another transaction locks the second row, then (once the cancel holds the
        # first and waits for the second) the first: a deadlock, which the cancel,
        # waiting longest, is the one to find and lose.
        await other.execute("SELECT 1 FROM asyncq_jobs WHERE id = %s FOR UPDATE", (second.id,))

        async def cancel() -> None:
            answers.update(await app.cancel(first.id, second.id))

        async def lock_first() -> None:
            await other.execute("SELECT 1 FROM asyncq_jobs WHERE id = %s FOR UPDATE", (first.id,))
            await other.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel)
            await waiting_for_a_lock(db, "query LIKE %s", "%asyncq_cancel(%")
            tg.start_soon(lock_first)
    assert answers == {first.id: "aborting", second.id: "aborting"}
