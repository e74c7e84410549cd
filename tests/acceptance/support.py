"""Helpers for the acceptance tests: real worker processes, real signals, a ledger file.

Workers run ``python -m asyncq worker tests.acceptance.ledger_app:app`` against the test
database; every task execution appends to a ledger file outside the database, so a test
can count executions independently of what the jobs table says. Nothing here sleeps for
a fixed time: tests poll with `wait_until` and a deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

REPO = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.ledger_app:app"
NOOP = "tests.acceptance.ledger_app.noop"
SLEEP = "tests.acceptance.ledger_app.sleep"
KILL_OWN_WORKER = "tests.acceptance.ledger_app.kill_own_worker"
STUBBORN = "tests.acceptance.ledger_app.stubborn"

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "a condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


# -- the ledger -------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One ledger line; ``index`` is its position in the file (the order of the appends)."""

    index: int
    event: str
    job_id: int
    attempt: int
    pid: int
    at: float


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def entries(self) -> list[Entry]:
        found = []
        for index, line in enumerate(self.path.read_text().splitlines()):
            event, job_id, attempt, pid, at = line.split()
            found.append(Entry(index, event, int(job_id), int(attempt), int(pid), float(at)))
        return found

    def events(self, event: str, job_id: int | None = None) -> list[Entry]:
        return [
            e for e in self.entries() if e.event == event and (job_id is None or e.job_id == job_id)
        ]

    def mark(self, event: str) -> Entry:
        """Append a line of the test's own (job 0), to order it against the workers' lines."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, f"{event} 0 0 {os.getpid()} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)
        return self.events(event)[-1]


# -- worker processes -------------------------------------------------------------------


class WorkerProcess:
    """One ``asyncq worker`` process; its stderr (the log) goes to a file."""

    def __init__(self, args: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.args = list(args)
        self.log = log
        with log.open("wb") as stderr:
            self.popen = subprocess.Popen(
                args, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr
            )
        self.pid = self.popen.pid

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def worker_id(self) -> str:
        match = re.search(r"worker (\S+) started:", self.stderr())
        assert match, f"worker {self.pid} has not started:\n{self.stderr()}"
        return match[1]

    def wait_ready(self, timeout: float = 20) -> WorkerProcess:
        """Wait until the worker logs that its services (LISTEN included) are up."""

        def ready() -> bool:
            if not self.alive:
                raise AssertionError(
                    f"worker exited with {self.popen.returncode} before it was ready:\n"
                    + self.stderr()
                )
            return " started: " in self.stderr()

        wait_until(ready, timeout, f"worker {self.pid} to start")
        return self

    def wait_log(self, text: str, timeout: float) -> None:
        wait_until(lambda: text in self.stderr(), timeout, f"{text!r} in worker {self.pid}'s log")

    def send(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.pid} still running after {timeout:.0f}s:\n{self.stderr()}"
            ) from None

    def kill(self) -> None:
        if self.alive:
            self.popen.send_signal(signal.SIGCONT)  # a stopped process would not die
            self.popen.kill()
        self.popen.wait()


class Workers:
    """Starts worker processes and CLI commands; kills whatever is left at teardown."""

    def __init__(self, dsn: str, ledger: Ledger, logs: Path) -> None:
        self.dsn = dsn
        self.ledger = ledger
        self.logs = logs
        self.started: list[WorkerProcess] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("ASYNCQ_TEST_DSN", None)
        env.update(ASYNCQ_DSN=self.dsn, ASYNCQ_LEDGER=str(self.ledger.path), PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def start(
        self, *options: str, lease: float = 2, ready: bool = True, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        args = [sys.executable, "-m", "asyncq", "worker", APP, "--lease", str(lease), *options]
        log = self.logs / f"worker-{len(self.started)}.log"
        worker = WorkerProcess(args, env or self.env(), log)
        self.started.append(worker)
        if ready:
            worker.wait_ready()
        return worker

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "asyncq", *args],
            env=env or self.env(),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


# -- the jobs table ---------------------------------------------------------------------


def insert_jobs(
    db: psycopg.Connection[Any],
    task_name: str,
    args: Sequence[dict[str, Any]],
    **columns: Any,
) -> list[int]:
    """Enqueue jobs with plain SQL, as the contract allows; returns their ids in order."""
    names = ", ".join(columns)
    values = ", ".join(f"%({name})s" for name in columns)
    query = (
        f"INSERT INTO asyncq_jobs (task_name, args{', ' if columns else ''}{names})"
        f" SELECT %(task_name)s, a{', ' if columns else ''}{values}"
        " FROM jsonb_array_elements(%(args)s) AS a RETURNING id"
    )
    params = {"task_name": task_name, "args": Jsonb(list(args)), **columns}
    return sorted(row[0] for row in db.execute(query, params).fetchall())


def job_row(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} is gone"
    return row


def status_of(db: psycopg.Connection[Any], job_id: int) -> str:
    return str(job_row(db, job_id)["status"])
