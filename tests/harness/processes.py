"""Real worker processes and CLI commands of the harness app, and waiting for them.

Workers run ``python -m asyncq worker tests.harness.app:app`` against the test database,
with the ledger (`tests.harness.ledger`) named in their environment; each one's stderr
(its log) goes to a file of its own. Nothing here sleeps for a fixed time: tests poll
with `tests.harness.waiting` and a deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.harness.app import APP
from tests.harness.ledger import ENV as LEDGER_ENV
from tests.harness.ledger import Ledger
from tests.harness.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


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
    """Starts worker processes and CLI commands of the harness app with one ledger and
    one folder of logs; remembers whom it killed, and when; kills what is left at the end.
    ``env`` is added to every process's environment."""

    def __init__(self, dsn: str, ledger: Ledger, logs: Path, **env: str) -> None:
        self.dsn = dsn
        self.ledger = ledger
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.extra_env = env
        self.started: list[WorkerProcess] = []
        self.killed: dict[int, float] = {}  # pid -> time.time() of the kill

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("ASYNCQ_TEST_DSN", None)
        env.update(ASYNCQ_DSN=self.dsn, PYTHONUNBUFFERED="1", **self.extra_env)
        env[LEDGER_ENV] = str(self.ledger.path)
        env.update(extra)
        return env

    def start(
        self,
        *options: str,
        lease: float = 2,
        ready: bool = True,
        env: dict[str, str] | None = None,
        app: str = APP,
        prefix: Sequence[str] = (),
    ) -> WorkerProcess:
        """``prefix``: what runs the worker's command, ``ip netns exec NS`` say."""
        args = [
            *prefix,
            *(sys.executable, "-m", "asyncq", "worker", app, "--lease", str(lease), *options),
        ]
        worker = WorkerProcess(
            args, env or self.env(), self.logs / f"worker-{len(self.started)}.log"
        )
        self.started.append(worker)
        if ready:
            worker.wait_ready(30)
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

    def kill9(self, worker: WorkerProcess) -> float:
        """``kill -9``: no handler runs, no outcome is written, no job is handed back."""
        at = time.time()
        os.kill(worker.pid, signal.SIGKILL)
        worker.popen.wait(10)
        self.killed[worker.pid] = at
        return at

    def stop_all(self, timeout: float = 30) -> dict[int, int | None]:
        """SIGTERM to every live worker; their exit codes by pid."""
        live = [w for w in self.started if w.alive]
        for worker in live:
            worker.send(signal.SIGTERM)
        return {w.pid: w.wait(timeout) for w in live}

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()

    def tracebacks(self) -> list[str]:
        """Worker logs that hold a traceback: an error asyncq did not handle."""
        found = []
        for worker in self.started:
            text = worker.stderr()
            if "Traceback" in text:
                at = text.index("Traceback")
                found.append(f"{worker.log.name} (pid {worker.pid}):\n{text[at - 300 : at + 3000]}")
        return found
