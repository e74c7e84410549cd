"""Cancel meets crashes: a worker killed (SIGKILL) while it runs a job a cancel is stopping,
or frozen (SIGSTOP) so that it never hears the cancel. The job ends cancelled (by the
reaper, from its mark), never runs again, and no outcome of the dead or frozen worker
changes that."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults.support import wait_started
from tests.harness.app import SLEEP
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


def cancel(workers: Workers, job_id: int) -> str:
    done = workers.cli("cancel", "tests.harness.app:app", str(job_id), "--json")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)[str(job_id)])


@pytest.mark.parametrize("fault", ["kill-9-before-cancel", "kill-9-after-cancel", "frozen"])
def test_a_job_whose_worker_dies_or_freezes_during_an_abort_ends_cancelled(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger, fault: str
) -> None:
    holder = workers.start(lease=2)
    [job_id] = insert_jobs(db, SLEEP, [{"seconds": 60}], max_attempts=5)
    wait_started(ledger, job_id, 10, attempt=1)

    if fault == "kill-9-before-cancel":
        workers.kill9(holder)
        assert cancel(workers, job_id) == "aborting"  # the row still says running
    elif fault == "kill-9-after-cancel":
        holder.send(signal.SIGSTOP)  # so that the kill lands before the worker can act
        assert cancel(workers, job_id) == "aborting"
        workers.kill9(holder)
    else:
        holder.send(signal.SIGSTOP)
        assert cancel(workers, job_id) == "aborting"

    # Another worker's reaper finds the lease run out and reads the cancel's mark.
    workers.start(lease=2)
    wait_until(lambda: status_of(db, job_id) == "cancelled", 20, "the job to be cancelled")
    row = job_row(db, job_id)
    assert row["attempts"] == 1
    assert row["finished_at"] is not None

    if fault == "frozen":
        # Continued, it stops the attempt at once (its lease was not renewed for longer
        # than it may be): it writes nothing, though the cancel's message waits for it.
        holder.send(signal.SIGCONT)
        holder.wait_log("lease not renewed for", 10)
    # A cancelled job is not retried by anyone: a few leases later it still has not run.
    time.sleep(3)
    assert status_of(db, job_id) == "cancelled"
    assert [e.attempt for e in ledger.events("start", job_id)] == [1]
    assert not workers.tracebacks()
