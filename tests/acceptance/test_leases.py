"""Leases with real processes: a dead worker's job comes back, a live worker's job does not,
and a worker that lost its lease cannot write the outcome."""

from __future__ import annotations

import signal

from tests.harness.app import KILL_OWN_WORKER, SLEEP
from tests.harness.jobs import insert_jobs, job_row, status_of
from tests.harness.ledger import Ledger
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until


def test_job_of_a_killed_worker_runs_again_after_the_lease(
    db, workers: Workers, ledger: Ledger
) -> None:
    first = workers.start(lease=2)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 3}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")
    first.send(signal.SIGKILL)
    assert first.wait(5) == -signal.SIGKILL
    killed = ledger.mark("killed")
    assert status_of(db, job_id) == "running"

    second = workers.start(lease=2)
    wait_until(lambda: status_of(db, job_id) == "done", 20, "the job to be done")

    row = job_row(db, job_id)
    assert row["attempts"] == 2
    assert row["locked_by"] == second.worker_id
    starts = ledger.events("start", job_id)
    assert [(e.attempt, e.pid) for e in starts] == [(1, first.pid), (2, second.pid)]
    assert starts[1].index > killed.index, "the second run started before the kill"
    ends = ledger.events("end", job_id)
    assert [(e.attempt, e.pid) for e in ends] == [(2, second.pid)]


def test_heartbeat_keeps_a_long_job_with_one_worker(db, workers: Workers, ledger: Ledger) -> None:
    # The job outlives its 2 s lease two and a half times over; the other worker
    # would take it the moment the lease lapsed.
    procs = [workers.start(lease=2, ready=False) for _ in range(2)]
    for proc in procs:
        proc.wait_ready()
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 5}])
    wait_until(lambda: status_of(db, job_id) in ("done", "failed"), 20, "the job to finish")

    row = job_row(db, job_id)
    assert row["status"] == "done"
    assert row["attempts"] == 1
    assert row["last_error"] is None
    assert len(ledger.events("start", job_id)) == 1
    assert len(ledger.events("end", job_id)) == 1
    for proc in procs:
        assert proc.alive
        assert "lease lost" not in proc.stderr()
        assert "stopped renewing" not in proc.stderr()


def test_a_frozen_worker_that_lost_its_lease_cannot_overwrite_the_outcome(
    db, workers: Workers, ledger: Ledger
) -> None:
    frozen = workers.start(lease=2)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 3}])
    wait_until(lambda: ledger.events("start", job_id), 10, "the job to start")
    frozen.send(signal.SIGSTOP)

    # The frozen worker stops renewing its lease: another worker reaps the job and runs it.
    other = workers.start(lease=2)
    wait_until(lambda: status_of(db, job_id) == "done", 20, "the second attempt to be done")
    settled = job_row(db, job_id)
    assert settled["attempts"] == 2
    assert settled["locked_by"] == other.worker_id

    # Thawed, the first worker's sleep is over at once, but before the task goes on, the
    # worker's self-fence finds the lease unrenewed for longer than it may be: it cancels
    # the task and writes nothing.
    frozen.send(signal.SIGCONT)
    frozen.wait_log("lease not renewed for", 10)
    wait_until(lambda: ledger.events("cancel", job_id), 10, "the stale run to be cancelled")
    assert job_row(db, job_id) == settled
    assert frozen.alive

    starts = ledger.events("start", job_id)
    assert [(e.attempt, e.pid) for e in starts] == [(1, frozen.pid), (2, other.pid)]
    ends = {(e.attempt, e.pid) for e in ledger.events("end", job_id)}
    assert ends == {(2, other.pid)}
    assert [(e.attempt, e.pid) for e in ledger.events("cancel", job_id)] == [(1, frozen.pid)]


def test_a_job_that_keeps_killing_its_worker_ends_failed(
    db, workers: Workers, ledger: Ledger
) -> None:
    [job_id] = insert_jobs(db, KILL_OWN_WORKER, [{}], max_attempts=2)
    current: list[WorkerProcess] = []

    def failed() -> bool:
        if not current or not current[-1].alive:
            current.append(workers.start(lease=2, ready=False))
        return status_of(db, job_id) == "failed"

    wait_until(failed, 40, "the job to fail")

    row = job_row(db, job_id)
    assert row["attempts"] == 2
    assert "LeaseExpired" in row["last_error"]
    starts = ledger.events("start", job_id)
    assert [e.attempt for e in starts] == [1, 2]
    assert len({e.pid for e in starts}) == 2
    assert not ledger.events("end", job_id)
    by_pid = {proc.pid: proc for proc in current}
    for entry in starts:
        assert by_pid[entry.pid].wait(5) == -signal.SIGKILL
