"""app.requeue(): failed (and cancelled) jobs back to the queue with fresh attempts; every
other job refused with a reason; at most one requeue wins, however many run at once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio


def row(db: Any, job_id: int) -> tuple[str, int, bool]:
    found = db.execute(
        "SELECT status::text, attempts, finished_at IS NOT NULL FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return (found[0], found[1], found[2])


def insert(db: Any, status: str, **columns: Any) -> int:
    names = ["task_name", "status", *columns]
    values = ["requeue.work", status, *columns.values()]
    found = db.execute(
        f"INSERT INTO asyncq_jobs ({', '.join(names)})"
        f" VALUES ({', '.join(['%s'] * len(names))}) RETURNING id",
        values,
    ).fetchone()
    return int(found[0])


class Broken:
    """A task that fails until it is fixed, counting its runs per job."""

    def __init__(self, app: asyncq.App) -> None:
        self.fixed = False
        self.runs: Counter[int] = Counter()

        @app.task(name="requeue.work", max_attempts=2, retry=asyncq.Backoff(base=0, cap=0))
        async def work(n: int = 0) -> None:
            self.runs[asyncq.current_job().id] += 1
            if not self.fixed:
                raise RuntimeError("not fixed yet")

        self.task = work

    async def failed_jobs(self, count: int, drain: Any, **options: Any) -> list[int]:
        ids = [await self.task.options(**options).defer(n) for n in range(count)]
        await drain()
        self.runs.clear()
        return ids


async def test_requeue_by_id_runs_failed_jobs_again_to_done(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    broken = Broken(app)
    ids = await broken.failed_jobs(3, drain)
    assert [row(db, i) for i in ids] == [("failed", 2, True)] * 3

    result = await app.requeue(ids[:2])

    assert result == asyncq.RequeueResult(requeued=ids[:2], refused={})
    assert [row(db, i) for i in ids] == [("queued", 0, False)] * 2 + [("failed", 2, True)]
    broken.fixed = True
    await drain()
    assert [row(db, i) for i in ids] == [("done", 1, True)] * 2 + [("failed", 2, True)]
    assert broken.runs == {ids[0]: 1, ids[1]: 1}


async def test_a_cancelled_job_can_be_requeued(app: asyncq.App, db: Any, drain: Any) -> None:
    broken = Broken(app)
    broken.fixed = True
    cancelled = insert(db, "cancelled")
    assert (await app.requeue([cancelled])).requeued == [cancelled]
    await drain()
    assert row(db, cancelled) == ("done", 1, True)


async def test_requeue_refuses_done_running_queued_and_unknown_jobs(
    app: asyncq.App, db: Any
) -> None:
    done = insert(db, "done", attempts=1, finished_at="2026-01-01T00:00:00Z")
    running = insert(db, "running", attempts=1, locked_by="w1")
    queued = insert(db, "queued")
    failed = insert(db, "failed", attempts=3)
    before = {i: row(db, i) for i in (done, running, queued)}

    result = await app.requeue([done, running, queued, failed, 999_999])

    assert result.requeued == [failed]
    assert result.refused == {
        done: "done: only failed or cancelled jobs can be requeued",
        running: "running: only failed or cancelled jobs can be requeued",
        queued: "already queued",
        999_999: "no such job",
    }
    assert {i: row(db, i) for i in before} == before  # left exactly as they were
    locked_by = db.execute("SELECT locked_by FROM asyncq_jobs WHERE id = %s", (running,))
    assert locked_by.fetchone() == ("w1",)


async def test_requeue_by_queue_and_task(app: asyncq.App, db: Any) -> None:
    in_q1 = insert(db, "failed", queue="q1")
    in_q2 = insert(db, "failed", queue="q2")
    other_task = db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue, status) VALUES ('other', 'q1', 'failed')"
        " RETURNING id"
    ).fetchone()[0]
    cancelled = insert(db, "cancelled", queue="q1")
    done = insert(db, "done", queue="q1")

    assert (await app.requeue(queues=["q1"], tasks=["requeue.work"])).requeued == [in_q1]
    assert (await app.requeue(tasks=["other"])).requeued == [other_task]
    assert (await app.requeue(queues=["nope"])).requeued == []
    assert (await app.requeue()).requeued == [in_q2]  # every failed job: one is left
    assert (await app.requeue()).requeued == []
    # Filters take failed jobs only: cancelled and done ones stay.
    assert row(db, cancelled)[0] == "cancelled"
    assert row(db, done)[0] == "done"
    with pytest.raises(ValueError, match="not both"):
        await app.requeue([in_q1], queues=["q1"])


async def test_concurrent_requeues_of_one_job_requeue_it_once_and_it_runs_once(
    app: asyncq.App, dsn: str, db: Any, drain: Any
) -> None:
    broken = Broken(app)
    ids = await broken.failed_jobs(12, drain)
    results: dict[tuple[int, int], asyncq.RequeueResult] = {}

    async with (
        asyncq.App(dsn, pool_max_size=len(ids)) as one,
        asyncq.App(dsn, pool_max_size=len(ids)) as other,
        await psycopg.AsyncConnection.connect(dsn) as blocker,
    ):
        # Lock the rows, so that every requeue below waits on them; then let go at once.
        await blocker.execute("SELECT id FROM asyncq_jobs WHERE id = ANY(%s) FOR UPDATE", (ids,))

        async def requeue(which: int, requeuer: asyncq.App, job_id: int) -> None:
            results[which, job_id] = await requeuer.requeue([job_id])

        async with anyio.create_task_group() as tg:
            for job_id in ids:
                tg.start_soon(requeue, 0, one, job_id)
                tg.start_soon(requeue, 1, other, job_id)
            await until_waiting(db, 2 * len(ids))
            await blocker.commit()

    for job_id in ids:
        winners = [w for w in (0, 1) if results[w, job_id].requeued == [job_id]]
        assert len(winners) == 1, (job_id, results[0, job_id], results[1, job_id])
        loser = results[1 - winners[0], job_id]
        assert loser.refused == {job_id: "already queued"}
    broken.fixed = True
    await drain()
    assert broken.runs == dict.fromkeys(ids, 1)
    assert {row(db, i) for i in ids} == {("done", 1, True)}


async def until_waiting(db: Any, count: int) -> None:
    """Wait until ``count`` sessions of this database are waiting for a lock."""

    def waiting() -> bool:
        found = db.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
        return bool(found[0] >= count)

    await until(waiting, what=f"{count} sessions to wait for the row locks")


async def test_a_failed_job_whose_unique_key_is_held_by_a_live_job_is_refused(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    broken = Broken(app)
    [failed] = await broken.failed_jobs(1, drain, unique_key="sync-user-7")
    live = await broken.task.options(unique_key="sync-user-7").defer()
    assert live != failed

    result = await app.requeue([failed])
    assert result.requeued == []
    assert result.refused == {failed: "failed, but a live job holds its unique key"}
    assert row(db, failed)[0] == "failed"
    assert (await app.requeue()).requeued == []

    broken.fixed = True
    await drain()  # the live job is done: the key is free again
    assert (await app.requeue([failed])).requeued == [failed]


async def test_failed_jobs_sharing_a_unique_key_requeue_one_of_them(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    broken = Broken(app)
    older = await broken.failed_jobs(1, drain, unique_key="sync-user-8")
    newer = await broken.failed_jobs(1, drain, unique_key="sync-user-8")
    pair = [*older, *newer]

    result = await app.requeue(pair)
    assert len(result.requeued) == 1
    [refused] = result.refused
    assert result.refused[refused] == "failed, but a live job holds its unique key"
    assert (await app.requeue()).requeued == []

    for job_id in pair:
        db.execute("UPDATE asyncq_jobs SET status = 'failed' WHERE id = %s", (job_id,))
    assert len((await app.requeue()).requeued) == 1
    assert (await app.requeue(pair)).requeued == []
    broken.fixed = True
    await drain()
    assert sorted(row(db, i)[0] for i in pair) == ["done", "failed"]


async def test_concurrent_requeues_of_failed_jobs_sharing_a_unique_key(
    app: asyncq.App, dsn: str, db: Any, drain: Any
) -> None:
    broken = Broken(app)
    older = await broken.failed_jobs(1, drain, unique_key="sync-user-9")
    newer = await broken.failed_jobs(1, drain, unique_key="sync-user-9")
    pair = [*older, *newer]

    async with asyncq.App(dsn) as other, await psycopg.AsyncConnection.connect(dsn) as blocker:
        await blocker.execute("SELECT id FROM asyncq_jobs WHERE id = ANY(%s) FOR UPDATE", (pair,))
        results: list[asyncq.RequeueResult] = []

        async def requeue(requeuer: asyncq.App, job_id: int) -> None:
            results.append(await requeuer.requeue([job_id]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(requeue, app, older[0])
            tg.start_soon(requeue, other, newer[0])
            await until_waiting(db, 2)
            await blocker.commit()

    assert sorted(len(r.requeued) for r in results) == [0, 1]
    assert [reason for r in results for reason in r.refused.values()] == [
        "failed, but a live job holds its unique key"
    ]
    assert sorted(row(db, i)[0] for i in pair) == ["failed", "queued"]
