"""The listings of the asyncq command and the dashboard read each state through its own
index: at 1,000,000 rows, none scans the table, and each reads about as many rows as it
shows; the count of a listing cut short reads the same index, and stops at its cap."""

from __future__ import annotations

from typing import Any

import pytest

import asyncq
from asyncq import admin

pytestmark = pytest.mark.anyio

ROWS = 1_000_000


@pytest.fixture
def million(db: Any) -> None:
    # 1,000,000 rows: nearly all done, as in a busy table; a few of every other state.
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue, status, finished_at, run_at, expires_at)"
        " SELECT CASE WHEN g %% 7 = 0 THEN 'b.task' ELSE 'a.task' END,"
        "        CASE WHEN g %% 3 = 0 THEN 'mail' ELSE 'default' END,"
        "        s, CASE WHEN s IN ('done', 'failed', 'cancelled')"
        "                THEN now() - g * interval '1 second' END,"
        "        now() - g * interval '1 millisecond',"
        "        CASE WHEN s = 'running' THEN now() + interval '30 seconds' END"
        "   FROM generate_series(1, %s) AS g,"
        "        LATERAL (SELECT (CASE WHEN g %% 10000 = 1 THEN 'failed'"
        "                              WHEN g %% 10000 = 2 THEN 'cancelled'"
        "                              WHEN g %% 10000 = 3 THEN 'running'"
        "                              WHEN g %% 10000 = 5 THEN 'waiting'"
        "                              WHEN g %% 1000 = 4 THEN 'queued'"
        "                              ELSE 'done' END)::asyncq_job_status AS s) AS state",
        (ROWS,),
    )
    db.execute("VACUUM ANALYZE asyncq_jobs")


async def plan(app: asyncq.App, query: str, params: dict[str, Any]) -> str:
    async with app.pool.connection() as conn:
        cur = await conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + app.store.q[query], params)
        return "\n".join(str(row[0]) for row in await cur.fetchall())


LISTINGS = [
    ("queued", "list_queued", "asyncq_jobs_ready"),
    ("running", "list_running", "asyncq_jobs_leases"),
    ("waiting", "list_waiting", "asyncq_jobs_waiting_for"),
    ("done", "list_done", "asyncq_jobs_done"),
    ("failed", "list_ended", "asyncq_jobs_ended"),
    ("cancelled", "list_ended", "asyncq_jobs_ended"),
    (None, "list_all", "asyncq_jobs_pkey"),
]


async def test_each_listing_reads_its_states_index_and_the_overview_no_done_row(
    app: asyncq.App, million: None
) -> None:
    # One test, so that the million rows are written once.
    for status, query, index in LISTINGS:
        for queue, task in ((None, None), ("mail", None), (None, "b.task")):
            params = {
                "status": status,
                "queue": queue,
                "task": task,
                "limit": 10,
                "before_id": None if status in ("queued", "running", "waiting") else ROWS // 2,
            }
            found = await plan(app, query, params)
            assert "Seq Scan" not in found, (status, queue, task, found)
            assert index in found, (status, queue, task, found)
        async with app.pool.connection() as conn:
            listed = await admin.jobs(conn, app.store, status=status, limit=10)
        assert len(listed) == 10
        assert status is None or {j.status for j in listed} == {status}
    async with app.pool.connection() as conn:
        first = await admin.jobs(conn, app.store, limit=10)
        second = await admin.jobs(conn, app.store, limit=10, before_id=first[-1].id)
        assert [j.id for j in first + second] == list(range(ROWS, ROWS - 20, -1))
        for status in ("done", "failed"):
            whole = await admin.jobs(conn, app.store, status=status, limit=20)
            first = await admin.jobs(conn, app.store, status=status, limit=10)
            second = await admin.jobs(
                conn, app.store, status=status, limit=10, before_id=first[-1].id
            )
            assert first + second == whole

    for status, query, index in LISTINGS:
        counting = query.replace("list_", "count_")
        for queue, task in ((None, None), ("mail", None), (None, "b.task")):
            params = {
                "status": status,
                "queue": queue,
                "task": task,
                "at_most": admin.COUNTED + 1,
                "before_id": None if status in ("queued", "running", "waiting") else ROWS // 2,
            }
            found = await plan(app, counting, params)
            assert "Seq Scan" not in found, (status, queue, task, found)
            assert index in found, (status, queue, task, found)
    async with app.pool.connection() as conn:
        counts = {
            status: await admin.count_jobs(conn, app.store, status=status)
            for status in (None, "queued", "failed", "done")
        }
        paged = await admin.count_jobs(conn, app.store, status="failed", before_id=ROWS // 2)
    # 1,000 queued jobs are counted exactly, more than 1,000 stop the count there.
    assert counts["queued"] == admin.Count(1000)
    assert counts["failed"] == admin.Count(ROWS // 10_000)
    assert counts[None] == counts["done"] == admin.Count(admin.COUNTED, more=True)
    assert paged == admin.Count(ROWS // 10_000 // 2)  # the failed jobs older than that one

    for query in ("queue_overview", "state_counts", "queue_history"):
        found = await plan(app, query, {"minutes": 60})
        # Counting done rows reads the done index; nothing reads the table in full.
        assert "Seq Scan on asyncq_jobs" not in found, found
    # The maintenance's sample of the queues (EXPLAIN ANALYZE writes it: the same reads).
    found = await plan(
        app, "write_queue_samples", {"queues": ["default"], "depth": [0], "running": [0]}
    )
    assert "Seq Scan on asyncq_jobs" not in found, found
    async with app.pool.connection() as conn:
        queues = {q.name: q for q in await admin.queues(conn, app.store)}
        stats = await admin.stats(conn, app.store)
    assert set(queues) == {"default", "mail"}
    assert sum(q.failed for q in queues.values()) == ROWS // 10_000
    assert sum(q.waiting for q in queues.values()) == ROWS // 10_000
    assert stats.rows["failed"] == ROWS // 10_000
    assert stats.rows["waiting"] == ROWS // 10_000
    assert abs(sum(stats.rows.values()) - ROWS) < ROWS // 100  # done rows are estimated


async def test_bad_listing_arguments_are_refused(app: asyncq.App) -> None:
    async with app.pool.connection() as conn:
        with pytest.raises(ValueError, match="unknown status"):
            await admin.jobs(conn, app.store, status="stuck")
        with pytest.raises(ValueError, match="limit"):
            await admin.jobs(conn, app.store, limit=0)
        with pytest.raises(asyncq.InvalidName):
            await admin.jobs(conn, app.store, queue="")
        with pytest.raises(ValueError, match="before_id"):
            await admin.jobs(conn, app.store, status="queued", before_id=5)
        assert await admin.job(conn, app.store, 10**12) is None


async def test_paging_on_through_jobs_that_ended_at_the_same_instant(
    app: asyncq.App, db: Any
) -> None:
    # A batch of outcomes is written by one statement: its jobs share one finished_at.
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, finished_at)"
        " SELECT 't', s, now() FROM generate_series(1, 25),"
        "      unnest('{done,failed}'::asyncq_job_status[]) AS s"
    )
    for status in ("done", "failed"):
        pages: list[list[int]] = []
        async with app.pool.connection() as conn:
            while True:
                before = pages[-1][-1] if pages else None
                page = await admin.jobs(conn, app.store, status=status, limit=10, before_id=before)
                if not page:
                    break
                pages.append([j.id for j in page])
        shown = [i for page in pages for i in page]
        assert [len(p) for p in pages] == [10, 10, 5]
        assert shown == sorted(shown, reverse=True) and len(set(shown)) == 25
