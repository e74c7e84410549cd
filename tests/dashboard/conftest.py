"""Fixtures for the dashboard's tests: an HTTP client on the dashboard of an open App
(httpx's ASGI transport, no server), ``asyncq dashboard`` processes, and jobs written
straight into the table."""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import asyncq
from tests.harness.app import APP
from tests.harness.ledger import Ledger
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until

Job = Callable[..., int]
Serve = Callable[..., str]
BASE = "http://dash.test"


def needs_the_extra() -> None:
    """Skip the calling module when the dashboard's extra is not installed."""
    for name in ("starlette", "jinja2"):
        pytest.importorskip(name, reason=f"the dashboard extra ({name}) is not installed")


def client_for(asgi: Any, base: str = BASE) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=base)


@pytest.fixture
async def client(app: asyncq.App) -> AsyncIterator[httpx.AsyncClient]:
    from asyncq.dashboard import create_app

    async with client_for(create_app(app)) as c:
        yield c


@pytest.fixture
def job(db: psycopg.Connection[Any]) -> Job:
    """Write one job row; returns its id."""

    def write(
        task: str = "mail.send",
        *,
        queue: str = "default",
        status: str = "queued",
        args: str = '{"to": "a@example.com"}',
        error: str | None = None,
        result: str | None = None,
        attempts: int = 0,
    ) -> int:
        ended = status in ("done", "failed", "cancelled")
        row = db.execute(
            "INSERT INTO asyncq_jobs (task_name, queue, status, args, last_error, result,"
            "                         attempts, finished_at, locked_by, locked_at, expires_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s,"
            "         CASE WHEN %s THEN now() END,"
            "         CASE WHEN %s THEN 'w1' END, CASE WHEN %s THEN now() END,"
            "         CASE WHEN %s THEN now() + interval '1 minute' END)"
            " RETURNING id",
            (task, queue, status, args, error, result, attempts, ended)
            + (status == "running",) * 3,
        ).fetchone()
        assert row is not None
        return int(row[0])

    return write


def csrf_token(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token on the page"
    return found[1]


def status_of(db: psycopg.Connection[Any], job_id: int) -> str:
    row = db.execute("SELECT status::text FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    """Worker processes of the harness app (`tests.harness`), killed at the end."""
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def dashboard_env(workers: Workers) -> dict[str, str]:
    """The workers' environment without a dashboard login of the caller's own."""
    env = workers.env()
    for name in ("ASYNCQ_DASHBOARD_USER", "ASYNCQ_DASHBOARD_PASSWORD", "ASYNCQ_DASHBOARD_TOKEN"):
        env.pop(name, None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dashboards() -> Iterator[list[WorkerProcess]]:
    """The ``asyncq dashboard`` processes `serve` started, in order; killed at the end."""
    started: list[WorkerProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.kill()


@pytest.fixture
def serve(workers: Workers, tmp_path: Path, dashboards: list[WorkerProcess]) -> Serve:
    """``serve(*options, env=None)``: ``asyncq dashboard`` of the harness app as its own
    process on a free port (``env`` added to its environment); returns its base URL
    (127.0.0.1) once it answers. Every one is killed at the end (`dashboards`)."""
    started = dashboards

    def start(*options: str, env: dict[str, str] | None = None) -> str:
        port = free_port()
        args = [sys.executable, "-m", "asyncq", "dashboard", APP, "--port", str(port), *options]
        log = tmp_path / f"dashboard-{len(started)}.log"
        process = WorkerProcess(args, {**dashboard_env(workers), **(env or {})}, log)
        started.append(process)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if not process.alive:
                raise AssertionError(f"the dashboard exited:\n{process.stderr()}")
            try:
                httpx.get(url + "/style.css", timeout=2)  # any answer, a 401 too
            except httpx.TransportError:
                return False
            return True

        wait_until(up, 30, "the dashboard to answer")
        return url

    return start
