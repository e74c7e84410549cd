"""A job that kills its worker (SIGKILL) every time it runs: it ends failed after exactly
max_attempts attempts, with a LeaseExpired error, and never runs again. The time it
takes to fail is measured and recorded in ``results/``."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults.support import figures
from tests.harness.app import KILL_OWN_WORKER, NOOP
from tests.harness.jobs import insert_jobs, job_row, status_of
from tests.harness.ledger import Ledger
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until

__all__ = ["figures"]  # fixtures

LEASE = 2
MAX_ATTEMPTS = 3


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def test_a_job_that_kills_its_worker_every_time_fails_after_max_attempts(
    db: psycopg.Connection[Any],
    workers: Workers,
    ledger: Ledger,
    figures: Callable[[str, dict[str, Any]], None],
) -> None:
    # A supervisor of the test's own: a worker is always running, restarted when it dies.
    running: list[WorkerProcess] = [workers.start(lease=LEASE)]
    [job_id] = insert_jobs(db, KILL_OWN_WORKER, [{}], max_attempts=MAX_ATTEMPTS)
    deferred = time.time()

    def failed() -> bool:
        if not running[-1].alive:
            running.append(workers.start(lease=LEASE, ready=False))
        return status_of(db, job_id) == "failed"

    wait_until(failed, MAX_ATTEMPTS * (LEASE + 8) + 10, "the job to fail")
    seen_failed = time.time()
    row = job_row(db, job_id)
    time_to_failure = (row["finished_at"] - row["created_at"]).total_seconds()

    assert row["attempts"] == MAX_ATTEMPTS
    assert row["last_error"].startswith("LeaseExpired: worker ")
    assert f"attempt {MAX_ATTEMPTS} of {MAX_ATTEMPTS}" in row["last_error"]
    starts = ledger.events("start", job_id)
    assert [e.attempt for e in starts] == list(range(1, MAX_ATTEMPTS + 1))
    assert len({e.pid for e in starts}) == MAX_ATTEMPTS
    assert not ledger.events("end", job_id)
    by_pid = {proc.pid: proc for proc in running}
    for entry in starts:
        assert by_pid[entry.pid].wait(5) == -signal.SIGKILL

    # Failed for good: a live worker leaves it alone, and runs the next job.
    survivor = running[-1]
    survivor.wait_ready()
    [after] = insert_jobs(db, NOOP, [{}])
    wait_until(lambda: status_of(db, after) == "done", 10, "a normal job to run")
    time.sleep(LEASE + 1)
    assert job_row(db, job_id) == row
    assert len(ledger.events("start", job_id)) == MAX_ATTEMPTS
    assert survivor.alive

    attempt_times = [round(b.at - a.at, 3) for a, b in itertools.pairwise(starts)]
    figures(
        "crash_loop",
        {
            "lease_s": LEASE,
            "max_attempts": MAX_ATTEMPTS,
            "attempts": row["attempts"],
            "time_to_failure_s": round(time_to_failure, 3),
            "seconds_between_attempts": attempt_times,
            "workers_started": len(running),
            "observed_by_test_s": round(seen_failed - deferred, 3),
        },
    )
    assert time_to_failure < MAX_ATTEMPTS * (LEASE + 8)
