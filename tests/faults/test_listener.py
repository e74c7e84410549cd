"""The LISTEN connection killed loudly (pg_terminate_backend) and silently (a proxy that
stops forwarding it but keeps the socket open).

Workers poll only every 60 s here, longer than each test: a job they pick up in
seconds was picked up through the listener, by a notification or by the catch-up
claim it makes when its connection is lost and when it reconnects. The recovery time is
measured from the kill (or the freeze) to the start of the first job deferred while the
listener was away, and recorded in ``results/``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq.pools import FLOOR
from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import figures, wait_started
from tests.harness.app import NOOP
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.proxy import Proxy
from tests.harness.waiting import wait_until

__all__ = ["figures"]  # fixtures

DBNAME = "listener_faults"
POLL = ("--poll-interval", "60")

LISTEN_BACKEND = """
SELECT pid FROM pg_stat_activity WHERE application_name = %s || ':listener'
"""


@pytest.fixture(scope="module")
def server() -> Iterator[ControlledPostgres]:
    pg = ControlledPostgres()
    try:
        pg.init()
        pg.start()
        with psycopg.connect(pg.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DBNAME}")

        async def migrate() -> None:
            async with asyncq.App(pg.dsn(DBNAME)) as app:
                await app.migrate()

        anyio.run(migrate)
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def pgdb(server: ControlledPostgres) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(server.dsn(DBNAME), autocommit=True) as conn:
        conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")
        yield conn


@pytest.fixture
def proxy(server: ControlledPostgres) -> Iterator[Proxy]:
    proxy = Proxy(("127.0.0.1", server.port))
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def workers(server: ControlledPostgres, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(server.dsn(DBNAME), ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def listen_backend(db: psycopg.Connection[Any], worker_pid: int) -> int:
    rows = db.execute(LISTEN_BACKEND, (f"asyncq:{worker_pid}",)).fetchall()
    assert len(rows) == 1, f"expected one LISTEN connection of worker {worker_pid}: {rows}"
    return int(rows[0][0])


def check_wakeups(db: psycopg.Connection[Any], ledger: Ledger) -> float:
    """Defer one job and return how long its notification took to start it."""
    deferred = ledger.mark("probe")
    [probe] = insert_jobs(db, NOOP, [{}])
    return wait_started(ledger, probe, 5).at - deferred.at


def test_listener_terminated_loudly_reconnects_and_catches_up(
    pgdb: psycopg.Connection[Any],
    workers: Workers,
    ledger: Ledger,
    figures: Callable[[str, dict[str, Any]], None],
) -> None:
    worker = workers.start(*POLL, lease=30)
    before = check_wakeups(pgdb, ledger)
    backend = listen_backend(pgdb, worker.pid)

    killed = ledger.mark("killed")
    assert pgdb.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone() == (True,)
    worker.wait_log("listener connection lost", 5)
    # Deferred once the worker knows it lost the listener and made its claim on the loss,
    # before it reconnects: only the catch-up claim after the reconnect can pick it up.
    [deaf] = insert_jobs(pgdb, NOOP, [{}])
    started = wait_started(ledger, deaf, 10)
    recovery = started.at - killed.at
    worker.wait_log("listener reconnected", 5)
    assert listen_backend(pgdb, worker.pid) != backend

    after = check_wakeups(pgdb, ledger)
    assert recovery < 5, f"the job deferred while the listener was away took {recovery:.1f}s"
    assert worker.alive
    figures(
        "listener_loud",
        {
            "fault": "pg_terminate_backend of the LISTEN connection",
            "recovery_s": round(recovery, 3),
            "wakeup_latency_before_s": round(before, 3),
            "wakeup_latency_after_s": round(after, 3),
        },
    )


@pytest.mark.parametrize(
    ("interval", "timeout"), [(10.0, 5.0), (2.0, 1.0)], ids=["default-health-check", "fast"]
)
def test_listener_frozen_silently_is_detected_and_catches_up(
    pgdb: psycopg.Connection[Any],
    workers: Workers,
    proxy: Proxy,
    ledger: Ledger,
    figures: Callable[[str, dict[str, Any]], None],
    interval: float,
    timeout: float,
) -> None:
    health = (
        "--listener-health-interval",
        str(interval),
        "--listener-health-timeout",
        str(timeout),
    )
    env = workers.env(ASYNCQ_DSN=proxy.dsn(DBNAME))
    worker = workers.start(*POLL, *health, lease=30, env=env)
    before = check_wakeups(pgdb, ledger)
    wait_until(lambda: len(proxy.listeners()) == 1, 5, "the LISTEN connection on the proxy")

    frozen = ledger.mark("frozen")
    assert proxy.freeze_listeners() == 1
    # Its notification reaches the proxy and goes no further.
    [deaf] = insert_jobs(pgdb, NOOP, [{}])
    started = wait_started(ledger, deaf, interval + timeout + 10)
    recovery = started.at - frozen.at
    assert worker.stderr().count("listener connection lost (TimeoutError") == 1, worker.stderr()
    worker.wait_log("listener reconnected", 5)
    wait_until(lambda: len(proxy.listeners()) == 1, 5, "a new LISTEN connection")

    after = check_wakeups(pgdb, ledger)
    # Nothing picked the job up before the health check could have failed (it gives up
    # after the pace of the checks before it, `pools.FLOOR` before any is known) ...
    gives_up = min(timeout, FLOOR)
    assert recovery > gives_up - 0.3, f"picked up after {recovery:.1f}s: was the listener deaf?"
    # ... and the health check found the silence within its interval and timeout (plus at
    # most 1 s of reconnect backoff and some slack for a busy machine).
    assert recovery < interval + timeout + 3, f"recovery took {recovery:.1f}s"
    assert worker.alive
    figures(
        f"listener_silent_{interval:g}s_{timeout:g}s",
        {
            "fault": "proxy stops forwarding the LISTEN connection, socket kept open",
            "health_interval_s": interval,
            "health_timeout_s": timeout,
            "recovery_s": round(recovery, 3),
            "wakeup_latency_before_s": round(before, 3),
            "wakeup_latency_after_s": round(after, 3),
        },
    )
