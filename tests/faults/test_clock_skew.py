"""Workers whose clocks are ten minutes off: leases, backoff and run_at follow the
database's clock only.

The worker runs under libfaketime (``apt-get install faketime``): ``FAKETIME=+10m`` or
``-10m`` shifts its wall clock (time(), gettimeofday(), CLOCK_REALTIME), and
``DONT_FAKE_MONOTONIC=1`` leaves its monotonic clock alone, as on a machine whose
clock is wrong but ticks normally. Each test first checks that the skew took effect:
the worker's log lines carry timestamps ten minutes off.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults.support import db_now, wait_started
from tests.harness.app import FAIL_SLOWLY_RETRIED, NOOP, SLEEP
from tests.harness.jobs import insert_jobs, job_row, status_of
from tests.harness.ledger import Ledger
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = 600.0
RETRY_IN = 40.0  # tests.harness.app.fail_slowly_retried: Backoff(base=40, factor=1, jitter=0)

pytestmark = pytest.mark.skipif(
    not LIBFAKETIME.exists(),
    reason=f"libfaketime is not installed ({LIBFAKETIME} is missing): apt-get install faketime",
)


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def skewed(workers: Workers, offset: str) -> dict[str, str]:
    return workers.env(
        LD_PRELOAD=str(LIBFAKETIME), FAKETIME=offset, DONT_FAKE_MONOTONIC="1", TZ="UTC"
    )


def check_skew(worker: WorkerProcess, expected: float) -> float:
    """The worker's clock minus ours, from the timestamp of its 'started' log line."""
    match = re.search(r"^(\S+ \S+) INFO .* started: ", worker.stderr(), re.M)
    assert match, worker.stderr()
    logged = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)  # TZ=UTC
    skew = logged.timestamp() - time.time()
    assert abs(skew - expected) < 15, (
        f"the worker's clock is {skew:+.0f}s off, not {expected:+.0f}s"
    )
    return skew


def assert_lease_on_database_clock(db: psycopg.Connection[Any], job_id: int, lease: float) -> None:
    row = job_row(db, job_id)
    assert row["status"] == "running"
    assert row["expires_at"] - row["locked_at"] == timedelta(seconds=lease)
    # Claimed or renewed (every lease/4) by the database's now(), not the worker's.
    behind = (db_now(db) - row["locked_at"]).total_seconds()
    assert 0 <= behind < lease / 4 + 1.5, f"locked_at is {behind:+.1f}s from now()"


def test_a_worker_ten_minutes_ahead_follows_the_database_clock(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger
) -> None:
    lease = 3.0
    worker = workers.start("--poll-interval", "0.5", lease=lease, env=skewed(workers, "+10m"))
    check_skew(worker, +SKEW)

    # Not due for 10 s by the database; long due by the worker's clock.
    run_at = db.execute("SELECT now() + interval '10 seconds'").fetchone()[0]
    [later] = insert_jobs(db, NOOP, [{}], run_at=run_at)
    [long_job] = insert_jobs(db, SLEEP, [{"seconds": 2}])
    [failing] = insert_jobs(db, FAIL_SLOWLY_RETRIED, [{}])

    wait_started(ledger, long_job, 10)
    assert_lease_on_database_clock(db, long_job, lease)

    def retried() -> dict[str, Any] | None:
        row = job_row(db, failing)
        return row if row["status"] == "queued" and row["attempts"] == 1 else None

    row = wait_until(retried, 10, "the failing job to be queued for a retry")
    wait_for_retry = (row["run_at"] - db_now(db)).total_seconds()
    assert RETRY_IN - 3 < wait_for_retry <= RETRY_IN, wait_for_retry

    assert status_of(db, later) == "queued"
    wait_until(lambda: status_of(db, later) == "done", 20, "the delayed job to run")
    claimed_at = job_row(db, later)["locked_at"]
    assert claimed_at >= run_at, f"claimed {(run_at - claimed_at).total_seconds():.1f}s early"
    assert (claimed_at - run_at).total_seconds() < 3

    wait_until(lambda: status_of(db, long_job) == "done", 10, "the long job to finish")
    assert job_row(db, long_job)["attempts"] == 1
    assert "lease lost" not in worker.stderr()
    assert worker.alive


def test_a_worker_ten_minutes_behind_runs_ready_jobs_and_keeps_its_leases(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger
) -> None:
    lease = 2.0
    worker = workers.start(lease=lease, env=skewed(workers, "-10m"))
    check_skew(worker, -SKEW)

    [ready] = insert_jobs(db, NOOP, [{}])
    wait_until(lambda: status_of(db, ready) == "done", 5, "a ready job to run")

    # Three leases long: only its heartbeat keeps it from being reaped.
    [long_job] = insert_jobs(db, SLEEP, [{"seconds": 3 * lease}])
    wait_started(ledger, long_job, 5)
    time.sleep(lease)
    assert_lease_on_database_clock(db, long_job, lease)
    wait_until(lambda: status_of(db, long_job) == "done", 20, "the long job to finish")

    row = job_row(db, long_job)
    assert (row["attempts"], row["last_error"]) == (1, None)
    assert [e.event for e in ledger.entries() if e.job_id == long_job] == ["start", "end"]
    assert "lease lost" not in worker.stderr()
    assert "stopped renewing" not in worker.stderr()
    assert worker.alive
