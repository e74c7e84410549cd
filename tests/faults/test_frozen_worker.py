"""A worker frozen (SIGSTOP) past its lease, then continued (SIGCONT): whatever it does
late, a success or a failure, changes nothing, and a run still going is stopped by its
self-fence at once. The job has been run again elsewhere and keeps the second worker's
outcome.

In these tests the frozen worker stops itself (`tests.harness.app.freeze_then` sends SIGSTOP to
its own process during attempt 1), so the freeze falls at a known point: once
continued, the task fails or returns before any other part of the worker has run, and
the test knows which write the fence has to refuse. The test sends the SIGCONT.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults.support import process_state, wait_started
from tests.harness.app import FREEZE_THEN, SLEEP_BY_ATTEMPT
from tests.harness.jobs import insert_jobs, job_row, status_of
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def events_of(ledger: Ledger, job_id: int) -> list[tuple[str, int, int]]:
    return [(e.event, e.attempt, e.pid) for e in ledger.entries() if e.job_id == job_id]


@pytest.mark.parametrize(
    ("late", "thawed"),
    [("fail", "running"), ("succeed", "running"), ("fail", "done")],
    ids=["failure-while-rerun", "success-while-rerun", "failure-after-rerun"],
)
def test_a_late_outcome_of_a_frozen_worker_changes_nothing(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger, late: str, thawed: str
) -> None:
    """Continued while the second attempt runs, only the fences on the writes (the
    worker and the attempt) stop the late outcome; once it is done, its status does too."""
    frozen = workers.start(lease=2, env=workers.env(HARNESS_SELF_STOP="1"))
    [job_id] = insert_jobs(db, FREEZE_THEN, [{"then": late, "seconds": 3}])
    wait_started(ledger, job_id, 10, attempt=1)
    wait_until(lambda: process_state(frozen.pid) == "T", 5, "the worker to stop itself")

    # Its lease runs out; another worker reaps the job and runs it to success.
    other = workers.start(lease=2)
    wait_started(ledger, job_id, 20, attempt=2)
    if thawed == "done":
        wait_until(lambda: status_of(db, job_id) == "done", 20, "the second attempt to be done")
    before = job_row(db, job_id)
    assert (before["status"], before["attempts"]) == (thawed, 2)
    assert before["locked_by"] == other.worker_id
    assert before["last_error"].startswith("LeaseExpired: worker ")

    frozen.send(signal.SIGCONT)
    what = "retry" if late == "fail" else "done"
    frozen.wait_log(f"lease lost during attempt 1 (before its outcome ({what}) was written)", 10)
    after = job_row(db, job_id)
    if thawed == "running":  # the second worker's heartbeat may have renewed its lease
        for renewed in ("locked_at", "expires_at"):
            del before[renewed], after[renewed]
    assert after == before

    wait_until(lambda: status_of(db, job_id) == "done", 20, "the second attempt to be done")
    row = job_row(db, job_id)
    assert (row["attempts"], row["locked_by"]) == (2, other.worker_id)
    assert row["last_error"] == before["last_error"]
    assert frozen.alive
    late_event = "fail" if late == "fail" else "end"
    events = events_of(ledger, job_id)
    assert events[:2] == [("start", 1, frozen.pid), ("start", 2, other.pid)]
    assert sorted(events[2:]) == sorted([(late_event, 1, frozen.pid), ("end", 2, other.pid)])
    if thawed == "running":
        assert events[2] == (late_event, 1, frozen.pid)
    assert "Traceback" not in frozen.stderr()


def test_a_thawed_worker_stops_its_stale_run_at_once_and_changes_nothing(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger
) -> None:
    frozen = workers.start(lease=2, env=workers.env(HARNESS_SELF_STOP="1"))
    [job_id] = insert_jobs(db, FREEZE_THEN, [{"then": "sleep", "seconds": 5}])
    wait_started(ledger, job_id, 10, attempt=1)
    wait_until(lambda: process_state(frozen.pid) == "T", 5, "the worker to stop itself")

    other = workers.start(lease=2)
    wait_started(ledger, job_id, 20, attempt=2)

    # Continued while the second attempt runs: before its task goes on sleeping and before
    # its heartbeat runs, the worker's self-fence finds the lease unrenewed for longer than
    # it may be, cancels the task and gives the attempt up (the heartbeat never sees it).
    frozen.send(signal.SIGCONT)
    frozen.wait_log(f"job {job_id} ({FREEZE_THEN}): lease not renewed for", 5)
    wait_until(lambda: ledger.events("cancel", job_id), 5, "the frozen run to be cancelled")
    running = job_row(db, job_id)
    assert running["status"] == "running"
    assert (running["attempts"], running["locked_by"]) == (2, other.worker_id)

    wait_until(lambda: status_of(db, job_id) == "done", 20, "the second attempt to be done")
    row = job_row(db, job_id)
    assert (row["attempts"], row["locked_by"]) == (2, other.worker_id)
    assert events_of(ledger, job_id) == [
        ("start", 1, frozen.pid),
        ("start", 2, other.pid),
        ("cancel", 1, frozen.pid),
        ("end", 2, other.pid),
    ]
    assert frozen.alive
    assert "lease lost" not in frozen.stderr()
    assert "Traceback" not in frozen.stderr()


def test_a_thawed_worker_that_claims_its_own_job_again_holds_the_new_attempt(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger
) -> None:
    """The frozen worker itself gets the job back: the reaper of a worker that serves
    another queue returns it to the queue while the first worker is stopped, and the
    notification of that waits in the stopped worker's socket. Continued, the worker
    claims attempt 2 at once, while attempt 1 still runs there. Attempt 1's lease is
    gone: it must be cancelled, and its end must not take attempt 2's lease with it.

    Once continued, the worker's heartbeat (which would also cancel attempt 1) and its
    claim race. Here the claim comes first: the worker's lease is 8 s, so its heartbeat
    (every 2 s) is not due when it is continued, nor its self-fence (6.4 s after the last
    renewal), and the test expires the lease with SQL while the worker is stopped, as if
    it had been stopped for longer.
    """
    reaper = workers.start("--queue", "elsewhere", lease=2)  # it reaps, never claims this job
    first = workers.start("--concurrency", "2", lease=8)
    [job_id] = insert_jobs(db, SLEEP_BY_ATTEMPT, [{"seconds": [3, 6]}])
    wait_started(ledger, job_id, 10, attempt=1)
    first.send(signal.SIGSTOP)
    db.execute(
        "UPDATE asyncq_jobs SET expires_at = now() - interval '1 second' WHERE id = %s", (job_id,)
    )
    wait_until(lambda: status_of(db, job_id) == "queued", 10, "the job to be reaped")
    first.send(signal.SIGCONT)

    wait_until(lambda: status_of(db, job_id) in ("done", "failed"), 30, "the job to finish")
    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("done", 2), row
    assert row["locked_by"] == first.worker_id
    assert sorted(events_of(ledger, job_id)) == [
        ("cancel", 1, first.pid),
        ("end", 2, first.pid),
        ("start", 1, first.pid),
        ("start", 2, first.pid),
    ]
    assert "lease lost during attempt 1 (claimed again here as attempt 2)" in first.stderr()
    # Attempt 2's lease was renewed to its end (the heartbeat runs every 2 s), not only
    # until attempt 1 would have ended.
    [end] = ledger.events("end", job_id)
    assert row["locked_at"].timestamp() > end.at - 3, (row["locked_at"], end)
    assert "lease lost during attempt 2" not in first.stderr()
    assert (first.stderr() + reaper.stderr()).count("stopped renewing") == 1
    assert first.alive
