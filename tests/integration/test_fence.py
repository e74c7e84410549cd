"""The lease and the fence: a claim's lease starts when the claim is written, and a
write of a stale attempt is refused even after a requeue reset the attempts."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq.job import Job
from asyncq.worker.completer import Completer
from asyncq.worker.observer import Observer
from asyncq.worker.outcomes import Kind, Outcome
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio


def waiting_for_a_lock(db: Any) -> bool:
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return bool(row[0])


def status(db: Any, job_id: int) -> str:
    return str(db.execute("SELECT status FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()[0])


async def test_a_claim_that_waited_for_a_table_lock_gets_its_whole_lease(
    app: asyncq.App, db: Any, aconn: psycopg.AsyncConnection[Any]
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task(name="fence.hold")
    async def hold() -> None:
        started.set()
        await release.wait()

    job_id = await hold.defer()
    async with anyio.create_task_group() as tg:
        # A SHARE lock, as CREATE INDEX without CONCURRENTLY takes: the claim waits.
        await aconn.execute("BEGIN")
        await aconn.execute("LOCK TABLE asyncq_jobs IN SHARE MODE")
        tg.start_soon(lambda: app.run_worker(lease=4, poll_interval=0.2, handle_signals=False))
        await until(lambda: waiting_for_a_lock(db), what="the claim to wait for the lock")
        await anyio.sleep(3)  # the lock is held for most of a lease after the claim was sent
        await aconn.execute("COMMIT")
        released = await (await aconn.execute("SELECT clock_timestamp()")).fetchone()
        assert released is not None
        with anyio.fail_after(10):
            await started.wait()
        row = db.execute(
            "SELECT locked_at, expires_at FROM asyncq_jobs WHERE id = %s", (job_id,)
        ).fetchone()
        release.set()
        await until(lambda: status(db, job_id) == "done", what="the job to be done")
        tg.cancel_scope.cancel()
    locked_at, expires_at = row
    assert locked_at >= released[0] - timedelta(seconds=0.5)
    assert expires_at >= released[0] + timedelta(seconds=3.5)


async def test_a_stale_attempt_cannot_write_after_a_requeue_and_a_new_claim(
    app: asyncq.App, db: Any
) -> None:
    @app.task(name="fence.once", max_attempts=1)
    async def once() -> None:
        pass

    store, worker, lease = app.store, "host:1:stale", timedelta(seconds=30)
    job_id = await once.defer()
    async with app.pool.connection() as conn:
        [first] = await store.claim(conn, worker=worker, limit=1, queues=None, lease=lease)
        # The worker froze: its lease ran out, the reaper failed the job (its only attempt),
        # a person requeued it, and the same worker, thawed, claimed it again.
        db.execute("UPDATE asyncq_jobs SET expires_at = now() - interval '1 second'")
        reaped = await store.reap_expired(conn, limit=10)
        assert reaped == {job_id: "failed"}
        assert (await app.requeue([job_id])).requeued == [job_id]
        [second] = await store.claim(conn, worker=worker, limit=1, queues=None, lease=lease)
        assert second.attempt == first.attempt == 1
        # The first attempt's late outcome: refused, whatever the attempt number says.
        owned = await store.mark_done(conn, worker=worker, jobs=[first])
        assert owned == set()
    status = db.execute("SELECT status::text FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert status == ("running",)


class Endings(Observer):
    def __init__(self) -> None:
        self.finished_jobs: dict[int, str] = {}
        self.lost: dict[int, str] = {}

    def finished(self, outcome: Outcome, status: str) -> None:
        self.finished_jobs[outcome.job.id] = status

    def lease_lost(self, job: Job, why: str) -> None:
        self.lost[job.id] = why


# Each kind of outcome, and the status its write leaves.
WRITTEN = [
    (Kind.DONE, "done"),
    (Kind.RETRY, "queued"),
    (Kind.FAIL, "failed"),
    (Kind.SNOOZE, "queued"),
    (Kind.CANCEL, "cancelled"),
    (Kind.RELEASE, "queued"),
]


@pytest.mark.parametrize(("kind", "status"), WRITTEN, ids=[k.value for k, _ in WRITTEN])
async def test_an_outcome_written_by_a_try_whose_answer_was_lost_is_not_a_lease_lost(
    app: asyncq.App, db: Any, kind: Kind, status: str
) -> None:
    @app.task(name="fence.twice", max_attempts=3)
    async def twice() -> None:
        pass

    store, worker, lease = app.store, "host:1:retry", timedelta(seconds=30)
    written_id, reaped_id, taken_id = [await twice.defer() for _ in range(3)]
    async with app.pool.connection() as conn:
        claimed = await store.claim(conn, worker=worker, limit=3, queues=None, lease=lease)
    written, reaped, taken = sorted(claimed, key=lambda j: j.id)
    assert [written.id, reaped.id, taken.id] == [written_id, reaped_id, taken_id]
    outcomes = [
        Outcome(job, kind, error="ValueError: boom", delay=60.0) for job in (written, reaped, taken)
    ]

    def completer(observer: Observer) -> Completer:
        return Completer(
            pool=app.pool,
            store=store,
            worker=worker,
            observer=observer,
            on_written=lambda jobs: None,
            storable=str,
        )

    # The first try of the batch committed one job's outcome, and its answer was lost.
    first = completer(Endings())
    first.submit(outcomes[0])
    await first.finish()
    # Meanwhile the rescuer took back the two others (their lease ran out): one is queued
    # again at the claim this worker holds it by, the other claimed again elsewhere.
    db.execute(
        "UPDATE asyncq_jobs SET expires_at = now() WHERE id = ANY(%s)", ([reaped_id, taken_id],)
    )
    async with app.pool.connection() as conn:
        assert set(await store.reap_expired(conn, limit=10)) == {reaped_id, taken_id}
        db.execute("UPDATE asyncq_jobs SET priority = 1 WHERE id = %s", (taken_id,))
        [other] = await store.claim(conn, worker="host:2:other", limit=1, queues=None, lease=lease)
        assert other.id == taken_id
    # The retry of the whole batch: the fence refuses all three.
    endings = Endings()
    again = completer(endings)
    for outcome in outcomes:
        again.submit(outcome)
    await again.finish()
    assert endings.finished_jobs == {written_id: status}
    why = f"before its outcome ({kind.value}) was written"
    assert endings.lost == {reaped_id: why, taken_id: why}
