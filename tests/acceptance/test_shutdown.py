"""SIGTERM with real worker processes: stop claiming, finish within the grace period,
hand back what is left, exit 0; a second signal exits at once."""

from __future__ import annotations

import signal
import time

import pytest

from tests.acceptance.support import (
    NOOP,
    SLEEP,
    Ledger,
    Workers,
    insert_jobs,
    job_row,
    wait_until,
)


def test_sigterm_lets_the_running_job_finish_and_claims_nothing_new(
    db, workers: Workers, ledger: Ledger
) -> None:
    worker = workers.start("--concurrency", "4", "--grace", "15", lease=2)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 2}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    worker.send(signal.SIGTERM)
    worker.wait_log("stopping", 5)
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
    # back; the lease could not have brought it back yet.
    worker = workers.start("--grace", "1", lease=60)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 30}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    signalled = time.monotonic()
    worker.send(signum)
    assert worker.wait(10) == 0, worker.stderr()
    assert time.monotonic() - signalled < 5

    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 0)
    (ready,) = db.execute(
        "SELECT run_at <= now() FROM asyncq_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert ready, "the handed-back job is not ready to run at once"
    assert [e.attempt for e in ledger.events("cancel", job_id)] == [1]
    assert not ledger.events("end", job_id)


def test_a_second_sigterm_exits_at_once(db, workers: Workers, ledger: Ledger) -> None:
    worker = workers.start("--grace", "30", lease=60)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 30}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")

    worker.send(signal.SIGTERM)
    worker.wait_log("stopping", 5)
    signalled = time.monotonic()
    worker.send(signal.SIGTERM)
    assert worker.wait(5) != 0
    assert time.monotonic() - signalled < 3

    # Nothing was written on the way out: the lease will bring the job back.
    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("running", 1)
    assert not ledger.events("end", job_id)
