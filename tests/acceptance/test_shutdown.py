"""SIGTERM with real worker processes: stop claiming, finish within the grace period,
hand back what is left, exit 0; a second signal exits at once."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

from tests.harness.app import NOOP, SLEEP, SLEEP_IN_THREAD, SLOW_ECHO, STUBBORN
from tests.harness.jobs import insert_jobs, job_row
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until


def test_sigterm_lets_the_running_job_finish_and_claims_nothing_new(
    db, workers: Workers, ledger: Ledger
) -> None:
    worker = workers.start("--concurrency", "4", "--grace", "15", lease=2)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 2}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    worker.send(signal.SIGTERM)
    worker.wait_log("stopping", 30)
    # Ready jobs, free slots, a notification: a worker that is stopping must not take them.
    extra = insert_jobs(db, NOOP, [{"n": n} for n in range(3)])

    assert worker.wait(15) == 0, worker.stderr()
    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert [e.attempt for e in ledger.events("end", job_id)] == [1]
    for extra_id in extra:
        row = job_row(db, extra_id)
        assert (row["status"], row["attempts"], row["locked_by"]) == ("queued", 0, None)
        assert not ledger.events("start", extra_id)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_job_that_outlives_the_grace_period_is_handed_back(
    db, workers: Workers, ledger: Ledger, signum: int
) -> None:
    # A long lease: if the job is queued again right after the exit, the worker handed it
    # back; the lease could not have brought it back yet. The worker exits long before the
    # job would end.
    worker = workers.start("--grace", "1", lease=300)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 60}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    worker.send(signum)
    assert worker.wait(30) == 0, worker.stderr()

    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 0)
    (ready,) = db.execute(
        "SELECT run_at <= now() FROM asyncq_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert ready, "the handed-back job is not ready to run at once"
    assert [e.attempt for e in ledger.events("cancel", job_id)] == [1]
    assert not ledger.events("end", job_id)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_exits_at_once_and_says_when_the_jobs_come_back(
    db, workers: Workers, ledger: Ledger, signum: int
) -> None:
    # A grace and jobs that outlast the wait for the exit.
    worker = workers.start("--grace", "60", lease=300)
    ids = insert_jobs(db, SLEEP, [{"seconds": 60}, {"seconds": 61}])
    wait_until(lambda: all(ledger.events("start", i) for i in ids), 10, "the jobs to start")

    worker.send(signum)
    worker.wait_log("stopping", 30)
    worker.send(signum)
    assert worker.wait(30) != 0
    [said] = [line for line in worker.stderr().splitlines() if "second signal" in line]
    assert said == (
        "asyncq: second signal, exiting at once; its 2 running jobs go back to the queue"
        " when their lease (300s) expires"
    )

    # Nothing was written on the way out: the lease will bring the jobs back.
    for job_id in ids:
        row = job_row(db, job_id)
        assert (row["status"], row["attempts"]) == ("running", 1)
        assert not ledger.events("end", job_id)


def test_a_job_stopped_by_every_shutdown_counts_its_attempts_after_a_few(
    db, workers: Workers, ledger: Ledger
) -> None:
    # A job longer than the grace period, and a deploy every few seconds: the first hand-backs
    # are free, then each counts as an attempt, so the job cannot loop forever.
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 60}], max_attempts=2)
    for cycle in range(1, 9):
        worker = workers.start("--grace", "0.2", lease=60)
        wait_until(lambda n=cycle: len(ledger.events("start", job_id)) == n, 10, "the job to start")
        worker.send(signal.SIGTERM)
        assert worker.wait(10) == 0, worker.stderr()
        row = job_row(db, job_id)
        if row["status"] != "queued":
            break
    assert (row["status"], row["attempts"], cycle) == ("failed", 2, 5), row
    assert row["last_error"].startswith("HandedBack:"), row["last_error"]
    assert "shutdown" in row["last_error"]


def test_a_task_that_swallows_cancellation_does_not_hang_shutdown(
    db, workers: Workers, ledger: Ledger
) -> None:
    worker = workers.start("--grace", "0.5", "--concurrency", "2", lease=60)
    [stubborn] = insert_jobs(db, STUBBORN, [{"seconds": 120}])
    [slow] = insert_jobs(db, SLEEP, [{"seconds": 120}])
    wait_until(lambda: ledger.events("start", stubborn), 10, "the stubborn job to start")
    wait_until(lambda: ledger.events("start", slow), 10, "the slow job to start")

    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.stderr()
    assert ledger.events("swallowed", stubborn)
    assert "did not stop" in worker.stderr()
    # The job that stopped was handed back; the stubborn one is left to its lease.
    assert (job_row(db, slow)["status"], job_row(db, slow)["attempts"]) == ("queued", 0)
    assert job_row(db, stubborn)["status"] == "running"


def test_a_def_task_that_outlives_the_grace_period_does_not_keep_the_worker_alive(
    db, workers: Workers, ledger: Ledger
) -> None:
    # Its thread cannot be stopped: the job is handed back and the process exits anyway
    # (the thread dies with it), long before the function would have returned.
    worker = workers.start("--grace", "1", lease=60)
    [job_id] = insert_jobs(db, SLEEP_IN_THREAD, [{"seconds": 60}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    worker.send(signal.SIGTERM)
    assert worker.wait(15) == 0, worker.stderr()
    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 0)
    assert not ledger.events("end", job_id)


def test_sigterm_stops_a_worker_whose_claims_come_back_full(db, workers: Workers) -> None:
    """With a backlog, claim after claim comes back full and the next goes out at once:
    the stop must reach the claim loop between two of them, not once the backlog is gone."""
    db.execute(
        "INSERT INTO asyncq_jobs (task_name) SELECT %s FROM generate_series(1, 100000)", (NOOP,)
    )
    worker = workers.start("--concurrency", "100", "--batch-size", "100")

    def done() -> int:
        (count,) = db.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'").fetchone()
        return int(count)

    wait_until(lambda: done() >= 1000, 30, "the worker to be busy")
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.stderr()
    (queued,) = db.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'queued'").fetchone()
    assert queued > 50_000, f"the worker went on claiming after SIGTERM: {queued} left"


def test_sigterm_lets_an_outcome_write_under_way_end(
    dsn: str, db, workers: Workers, ledger: Ledger
) -> None:
    """The job's outcome is being written when the worker stops: the write ends, and
    the worker exits after it. Cut off, it would leave the job running until its lease
    brought it back, to run a second time."""
    worker = workers.start("--grace", "15", lease=60)
    [job_id] = insert_jobs(db, SLOW_ECHO, [{"seconds": 1, "value": 7}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    def waiting_on_a_lock() -> bool:
        row = db.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
        return row is not None and row[0] > 0

    with psycopg.connect(dsn) as blocker:  # its transaction holds the row
        blocker.execute("SELECT 1 FROM asyncq_jobs WHERE id = %s FOR UPDATE", (job_id,))
        wait_until(waiting_on_a_lock, 10, "the outcome's write to wait for the row")
        worker.send(signal.SIGTERM)
        worker.wait_log("stopping", 30)
        # A worker that cut its write off exits within milliseconds; give it a second.
        deadline = time.monotonic() + 1.0
        while worker.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        exited_first = worker.popen.poll() is not None
        blocker.rollback()

    # (A write cut off may still commit: the server may not see its client go while it
    # waits for the row. It may as well be cancelled first, and the job run again.)
    assert not exited_first, "the worker exited with its outcome's write under way"

    assert worker.wait(15) == 0, worker.stderr()
    row = job_row(db, job_id)
    assert (row["status"], row["attempts"], row["result"]) == ("done", 1, 7)
    assert len(ledger.events("end", job_id)) == 1
