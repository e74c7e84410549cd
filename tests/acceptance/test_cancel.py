"""Cancel and abort across processes: a queued job is cancelled at once; a running one is
stopped by the worker process that holds it (its `finally` runs) and ends cancelled,
never retried; a cancel racing the job's own end leaves exactly one final state."""

from __future__ import annotations

import json
import random
import time

from tests.harness.app import SLEEP, WORK
from tests.harness.jobs import insert_jobs, job_row
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

FINAL = ("done", "failed", "cancelled")


def test_a_queued_job_is_cancelled_at_once_and_never_runs(
    db, workers: Workers, ledger: Ledger
) -> None:
    [job_id, sibling] = insert_jobs(db, SLEEP, [{"seconds": 0}] * 2)
    db.execute("UPDATE asyncq_jobs SET run_at = now() + interval '2 seconds'")
    done = workers.cli("cancel", "tests.harness.app:app", str(job_id))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"job {job_id}: cancelled"
    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("cancelled", 0)
    assert row["finished_at"] is not None

    workers.start()
    # Its sibling, due at the same time, runs: a claim that could take it would have.
    wait_until(lambda: job_row(db, sibling)["status"] == "done", what="the sibling to run")
    assert job_row(db, job_id)["status"] == "cancelled"
    assert not ledger.events("start", job_id)


def test_a_running_job_is_aborted_by_the_worker_process_that_holds_it(
    db, workers: Workers, ledger: Ledger
) -> None:
    # A long lease: the heartbeat (a quarter of it) cannot be what stops the job in time.
    worker = workers.start(lease=300)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 60}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    done = workers.cli("cancel", "tests.harness.app:app", str(job_id), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {str(job_id): "aborting"}
    wait_until(lambda: job_row(db, job_id)["status"] == "cancelled", what="the job to be cancelled")
    row = job_row(db, job_id)
    assert row["attempts"] == 1
    assert row["last_error"].startswith("Cancelled: attempt 1 of")
    assert [e.attempt for e in ledger.events("cancel", job_id)] == [1], "its finally did not run"
    worker.wait_log("a cancel asked for it", 30)

    time.sleep(1)  # a window for it to run again: it must not
    assert job_row(db, job_id)["status"] == "cancelled"
    assert len(ledger.events("start", job_id)) == 1, "a cancelled job ran again"
    assert worker.alive
    assert not workers.tracebacks()


def test_a_lost_notification_still_aborts_the_job_by_the_heartbeat(
    db, workers: Workers, ledger: Ledger
) -> None:
    # The mark without its notification, as if the listener had been away: the heartbeat
    # (every 0.5 s with a 2 s lease) reads it.
    workers.start(lease=2)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 60}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")
    db.execute("UPDATE asyncq_jobs SET abort_requested_at = now() WHERE id = %s", (job_id,))
    wait_until(lambda: job_row(db, job_id)["status"] == "cancelled", what="the job to be cancelled")
    assert [e.attempt for e in ledger.events("cancel", job_id)] == [1]


def test_a_cancel_racing_the_jobs_own_end_leaves_one_final_state(
    db, workers: Workers, ledger: Ledger
) -> None:
    for _ in range(2):
        workers.start("--concurrency", "20", lease=5)
    rng = random.Random(7)
    # About 2 s of work for 40 runners: the cancel finds jobs done, running and queued.
    ids = insert_jobs(db, WORK, [{"ms": rng.randrange(0, 500), "tag": n} for n in range(300)])
    wait_until(lambda: len(ledger.events("end")) >= 20, 10, "jobs to end")
    done = workers.cli("cancel", "tests.harness.app:app", *map(str, ids), "--json")
    assert done.returncode == 0, done.stderr
    told = {int(k): v for k, v in json.loads(done.stdout).items()}

    def settled() -> list[tuple[int, str, int]]:
        rows = db.execute(
            "SELECT id, status::text, attempts FROM asyncq_jobs WHERE id = ANY(%s)", (ids,)
        ).fetchall()
        return rows if all(r[1] in FINAL for r in rows) else []

    rows = wait_until(settled, 20, "every job to reach a final state")
    starts = ledger.by_job()
    kinds = {what for what in told.values()}
    assert kinds == {"done", "aborting", "cancelled"}, kinds
    for job_id, status, attempts in rows:
        ran = [e for e in starts.get(job_id, []) if e.event == "start"]
        ended = [e for e in starts.get(job_id, []) if e.event == "end"]
        assert len(ran) <= 1 and attempts <= 1, f"job {job_id} ran {len(ran)} times"
        what = told[job_id]
        if what == "cancelled":  # queued when the cancel came: never ran
            assert (status, ran) == ("cancelled", []), job_id
        elif what == "aborting":  # ran: it ended once, done or cancelled, never queued again
            assert status in ("done", "cancelled"), (job_id, status)
            assert (status == "done") == bool(ended), (job_id, status, ended)
        else:  # it had ended already
            assert what == status == "done", (job_id, what, status)
    assert not workers.tracebacks()


def test_cancel_of_an_unknown_id_says_so_and_exits_1(db, workers: Workers) -> None:
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 0}])
    done = workers.cli("cancel", "tests.harness.app:app", str(job_id), "999999999")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [f"job {job_id}: cancelled", "job 999999999: not found"]
