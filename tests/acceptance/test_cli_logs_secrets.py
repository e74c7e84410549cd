"""The log of real ``asyncq worker`` processes at the default level (INFO) holds neither job
arguments nor the DSN password: through failures, retries, a reaped job and a lost lease."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.harness.app import APP
from tests.harness.jobs import insert_jobs, job_row, status_of
from tests.harness.ledger import Ledger
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until

SECRET = "arg-secret-5e0c71d2"
PASSWORD = "dsn-password-93fa04c6"


def dsn_with_password(dsn: str) -> str:
    """The DSN with a password; the test servers use trust auth, so it still connects."""
    params = conninfo_to_dict(dsn)
    if params.get("password"):
        pytest.skip("the test DSN already has a password")
    candidate = make_conninfo(**{**params, "password": PASSWORD})
    with psycopg.connect(candidate, connect_timeout=5):
        pass
    return candidate


def start(workers: Workers, env: dict[str, str], *options: str) -> WorkerProcess:
    """``python -m asyncq worker`` on the guarded app, at the default log level."""
    args = [sys.executable, "-m", "asyncq", "worker", APP, *options]
    log = workers.logs / f"worker-{len(workers.started)}.log"
    proc = WorkerProcess(args, env, log)
    workers.started.append(proc)
    return proc.wait_ready()


def test_worker_logs_hold_no_arguments_and_no_password(
    db: Any, dsn: str, workers: Workers, ledger: Ledger, tmp_path: Path
) -> None:
    env = workers.env(ASYNCQ_DSN=dsn_with_password(dsn))
    quick = {
        "guarded.flaky": insert_jobs(db, "guarded.flaky", [{"token": SECRET}]),
        "guarded.doomed": insert_jobs(db, "guarded.doomed", [{"token": SECRET}]),
        # Arguments that do not fit the function: the error names the parameter only.
        "guarded.ok": insert_jobs(db, "guarded.ok", [{"tokn": SECRET}], max_attempts=1),
    }
    # A task this worker does not know: given back, for a worker that knows it.
    [unknown] = insert_jobs(db, "no.such.task", [{"token": SECRET}], max_attempts=1)
    [slow] = insert_jobs(db, "guarded.slow", [{"token": SECRET, "seconds": 60}])

    first = start(workers, env, "--lease", "1")
    wait_until(lambda: ledger.events("start", slow), 10, "the slow job to start")
    wait_until(
        lambda: all(status_of(db, i) in ("done", "failed") for ids in quick.values() for i in ids),
        10,
        "the quick jobs to finish",
    )
    wait_until(lambda: job_row(db, unknown)["last_error"], 10, "the unknown task's job given back")
    # Freeze the first worker: its lease lapses, a second worker reaps the job and runs it.
    first.send(signal.SIGSTOP)
    try:
        second = start(workers, env, "--lease", "1")
        wait_until(lambda: status_of(db, slow) == "done", 15, "the reaped job to be done")
    finally:
        first.send(signal.SIGCONT)
    # Thawed, it stops the stale attempt: its self-fence finds the lease unrenewed for too
    # long ("lease not renewed"), or its heartbeat finds it gone ("lease lost").
    wait_until(
        lambda: "lease not renewed" in first.stderr() or "lease lost" in first.stderr(),
        10,
        "the stale attempt to be given up",
    )
    wait_until(lambda: ledger.events("cancel", slow), 10, "the frozen attempt to be cancelled")

    for proc in (first, second):
        proc.send(signal.SIGTERM)
    assert first.wait(15) == 0, first.stderr()
    assert second.wait(15) == 0, second.stderr()

    # Everything happened as intended ...
    assert [status_of(db, i) for i in quick["guarded.flaky"]] == ["done"]
    assert job_row(db, quick["guarded.flaky"][0])["attempts"] == 2
    assert [status_of(db, i) for i in quick["guarded.doomed"]] == ["failed"]
    assert (status_of(db, unknown), job_row(db, unknown)["attempts"]) == ("queued", 0)
    assert job_row(db, slow)["attempts"] == 2
    # ... and was logged at INFO and above, with no argument and no password.
    logs = first.stderr() + second.stderr()
    for expected in (
        " INFO ",
        "retrying in",  # a retry
        "failed for good",  # a failure
        "unknown task 'no.such.task'",
        "unexpected keyword argument 'tokn'",
        "stopped renewing the lease",  # the reaped job
    ):
        assert expected in logs, f"{expected!r} not logged:\n{logs}"
    assert "lease not renewed" in logs or "lease lost" in logs, logs  # the stale attempt
    assert " DEBUG " not in logs
    assert SECRET not in logs
    assert json.dumps(SECRET) not in logs
    assert PASSWORD not in logs
    # The rows keep the arguments: they were hidden from the log, not lost.
    assert job_row(db, slow)["args"] == {"token": SECRET, "seconds": 60}
