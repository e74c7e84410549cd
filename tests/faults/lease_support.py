"""Helpers for the listener, lease, clock and poison fault tests.

Workers are real ``python -m asyncq worker tests.faults.lease_app:app`` processes;
executions are counted in the ledger file (see `tests.faults.lease_app`), the figures a
test measures go to ``tests/faults/results/<name>.json``. `Proxy` is a TCP proxy on
127.0.0.1 that can stop forwarding the LISTEN connection while keeping its sockets open.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.support import Entry, Ledger, WorkerProcess, Workers, wait_until

APP = "tests.faults.lease_app:app"
PREFIX = "tests.faults.lease_app."
NOOP = PREFIX + "noop"
SLEEP = PREFIX + "sleep"
SLEEP_BY_ATTEMPT = PREFIX + "sleep_by_attempt"
FREEZE_THEN = PREFIX + "freeze_then"
HOLD_CONNECTION = PREFIX + "hold_connection"
KILL_OWN_WORKER = PREFIX + "kill_own_worker"
FAIL_SLOWLY_RETRIED = PREFIX + "fail_slowly_retried"
TAKES = PREFIX + "takes"
RAISE_SYSTEM_EXIT = PREFIX + "raise_system_exit"
RAISE_KEYBOARD_INTERRUPT = PREFIX + "raise_keyboard_interrupt"

RESULTS = Path(__file__).parent / "results"


class LeaseWorkers(Workers):
    """`Workers` for ``tests.faults.lease_app``."""

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


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.txt")


def first_start(ledger: Ledger, job_id: int, attempt: int | None = None) -> Entry | None:
    for entry in ledger.events("start", job_id):
        if attempt is None or entry.attempt == attempt:
            return entry
    return None


def wait_started(ledger: Ledger, job_id: int, timeout: float, attempt: int | None = None) -> Entry:
    return wait_until(
        lambda: first_start(ledger, job_id, attempt), timeout, f"job {job_id} to start"
    )


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat: T when stopped, Z when dead."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def db_now(db: psycopg.Connection[Any]) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


# -- figures ----------------------------------------------------------------------------


@pytest.fixture
def figures(capsys: pytest.CaptureFixture[str]) -> Callable[[str, dict[str, Any]], None]:
    """``figures(name, values)``: writes results/<name>.json and prints it."""

    def save(name: str, values: dict[str, Any]) -> None:
        RESULTS.mkdir(exist_ok=True)
        document = {"test": name, "measured_at": datetime.now(UTC).isoformat(), **values}
        text = json.dumps(document, indent=2, ensure_ascii=False)
        (RESULTS / f"{name}.json").write_text(text + "\n")
        with capsys.disabled():
            print(f"\n[faults figures] {name}: {json.dumps(values)}")

    return save


# -- a TCP proxy that can go silent -----------------------------------------------------


class _Piped:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.listening = False  # the client sent a LISTEN
        self.frozen = threading.Event()
        self.closed = False


class Proxy:
    """Forwards 127.0.0.1:<port> to a PostgreSQL server, one pair of threads a connection.

    It reads the client's bytes as they pass (without SSL, the protocol is plain text): a
    connection that sends ``LISTEN`` is the worker's listener. `freeze_listeners` stops
    forwarding, both ways, on the listener connections open at that moment and keeps
    their sockets open: the worker sees no error, no reset, no FIN, only silence, as
    behind a dead NAT entry or a hung server. Connections made later (the pool's, the
    listener's next one) are forwarded normally.
    """

    LISTEN = b'LISTEN "asyncq.'

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.pipes: list[_Piped] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def dsn(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            pipe = _Piped(client, upstream)
            with self.lock:
                self.pipes.append(pipe)
            for src, dst, sniff in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(
                    target=self._pump, args=(pipe, src, dst, sniff), daemon=True
                ).start()

    def _pump(self, pipe: _Piped, src: socket.socket, dst: socket.socket, sniff: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if sniff and self.LISTEN in data:
                    pipe.listening = True
                if pipe.frozen.is_set():
                    self.stopping.wait()  # hold it, and the sockets, until the proxy closes
                    return
                dst.sendall(data)
        except OSError:
            pass
        if not pipe.frozen.is_set():
            self._close(pipe)

    def _close(self, pipe: _Piped) -> None:
        pipe.closed = True
        for sock in (pipe.client, pipe.upstream):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                sock.close()

    def listeners(self) -> list[_Piped]:
        with self.lock:
            return [p for p in self.pipes if p.listening and not p.closed and not p.frozen.is_set()]

    def freeze_listeners(self) -> int:
        """Go silent on every open listener connection; returns how many."""
        found = self.listeners()
        for pipe in found:
            pipe.frozen.set()
        return len(found)

    def close(self) -> None:
        self.stopping.set()
        with suppress(OSError):
            self.server.close()
        with self.lock:
            pipes = list(self.pipes)
        for pipe in pipes:
            self._close(pipe)
