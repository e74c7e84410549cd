"""examples/fastapi_sqlalchemy.py over HTTP: the ORM's order and its job, deferred on the
same AsyncSession, commit together or not at all; a worker confirms the order."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.harness.processes import WorkerProcess
from tests.harness.waiting import wait_until

pytestmark = pytest.mark.anyio

pytest.importorskip("fastapi", reason="FastAPI comes with the test extra")
pytest.importorskip("sqlalchemy", reason="SQLAlchemy comes with the test extra")

Connection = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
def fresh(db: Connection) -> Iterator[None]:
    """No orders table: the app's lifespan creates it (create_all)."""
    db.execute("DROP TABLE IF EXISTS shop_orders")
    yield
    db.execute("DROP TABLE IF EXISTS shop_orders")


@pytest.fixture
async def client(
    dsn: str, fresh: None, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """The example app, its lifespan running, on the test database."""
    monkeypatch.setenv("ASYNCQ_DSN", dsn)
    from examples.fastapi_sqlalchemy import app

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c,
    ):
        yield c


def saved(db: Connection) -> tuple[list[Any], list[Any]]:
    """The committed orders (id, item, job_id) and jobs (id, args)."""
    return (
        db.execute("SELECT id, item, job_id FROM shop_orders ORDER BY id").fetchall(),
        db.execute("SELECT id, args FROM asyncq_jobs ORDER BY id").fetchall(),
    )


async def test_order_and_job_commit_together(client: httpx.AsyncClient, db: Connection) -> None:
    response = await client.post("/orders", json={"item": "book", "quantity": 2})
    assert response.status_code == 201, response.text
    created = response.json()

    assert saved(db) == (
        [(created["id"], "book", created["job_id"])],
        [(created["job_id"], {"order_id": created["id"]})],
    )
    row = db.execute(
        "SELECT o.xmin::text = j.xmin::text, j.task_name, j.queue, j.status"
        " FROM shop_orders o JOIN asyncq_jobs j ON j.id = o.job_id"
    ).fetchone()
    assert row == (True, "examples.fastapi_sqlalchemy.send_confirmation", "emails", "queued")


async def test_a_failure_after_the_defer_leaves_neither_order_nor_job(
    client: httpx.AsyncClient, db: Connection
) -> None:
    ok = await client.post("/orders", json={"item": "pen", "quantity": 1})
    assert ok.status_code == 201

    failed = await client.post("/orders", json={"item": "lamp", "quantity": 1, "fail": True})
    assert failed.status_code == 500
    assert failed.json() == {"detail": "failed after writing; nothing was saved"}
    orders, jobs = saved(db)
    assert [o[1] for o in orders] == ["pen"]
    assert [j[0] for j in jobs] == [ok.json()["job_id"]]

    invalid = await client.post("/orders", json={"item": "lamp", "quantity": 0})
    assert invalid.status_code == 422
    assert len(saved(db)[1]) == 1


async def test_a_worker_runs_the_job_and_get_shows_the_order_confirmed(
    client: httpx.AsyncClient,
) -> None:
    from examples.fastapi_sqlalchemy import asyncq_app

    created = (await client.post("/orders", json={"item": "mug", "quantity": 3})).json()
    before = (await client.get(f"/orders/{created['id']}")).json()
    assert (before["status"], before["job"]["status"]) == ("new", "queued")

    stats = await asyncq_app.run_worker(drain=True, handle_signals=False)
    assert stats.done == 1

    after = (await client.get(f"/orders/{created['id']}")).json()
    assert (after["item"], after["quantity"], after["status"]) == ("mug", 3, "confirmed")
    assert after["job"] == {
        "id": created["job_id"],
        "status": "done",
        "attempts": 1,
        "last_error": None,
    }
    assert (await client.get("/orders/999999")).status_code == 404


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_uvicorn_and_an_asyncq_worker_process(dsn: str, fresh: None, tmp_path: Path) -> None:
    """The SQLAlchemy guide's way to run it: uvicorn serving the app, ``asyncq worker``
    in a process of its own, and HTTP requests over a socket."""
    env = {k: v for k, v in os.environ.items() if k != "ASYNCQ_TEST_DSN"}
    env.update(ASYNCQ_DSN=dsn, PYTHONUNBUFFERED="1")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = WorkerProcess(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_sqlalchemy:app", "--port", str(port)],
        env,
        tmp_path / "uvicorn.log",
    )
    worker: WorkerProcess | None = None
    try:
        wait_until(lambda: "Application startup complete" in server.stderr(), 30, "uvicorn")
        with httpx.Client(base_url=base, timeout=10) as http:
            created = http.post("/orders", json={"item": "book", "quantity": 2}).json()
            failed = http.post("/orders", json={"item": "lamp", "quantity": 1, "fail": True})
            assert failed.status_code == 500
            assert http.get(f"/orders/{created['id']}").json()["job"]["status"] == "queued"

            worker = WorkerProcess(
                [
                    sys.executable,
                    "-m",
                    "asyncq",
                    "worker",
                    "examples.fastapi_sqlalchemy:asyncq_app",
                ],
                env,
                tmp_path / "worker.log",
            ).wait_ready(30)
            # The task confirms the order in its own transaction; the job's outcome is
            # written after the task returns, so the two are waited for together.
            order = wait_until(
                lambda: (
                    (o := http.get(f"/orders/{created['id']}").json())["status"] == "confirmed"
                    and o["job"]["status"] not in ("queued", "running")
                    and o
                ),
                30,
                "the worker to confirm the order and its job to end",
            )
        assert order["job"] == {
            "id": created["job_id"],
            "status": "done",
            "attempts": 1,
            "last_error": None,
        }
        # The worker's process ran the task, on an engine of its own.
        assert f"confirmation sent for order {created['id']}" in worker.stderr()
        worker.send(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.stderr()
        server.send(signal.SIGTERM)
        # uvicorn ends by raising the signal again, once its shutdown is complete.
        assert server.wait(30) in (0, -signal.SIGTERM), server.stderr()
        assert "Application shutdown complete" in server.stderr()
    finally:
        for process in (worker, server):
            if process is not None:
                process.kill()
    assert worker is not None
    assert "Traceback" not in server.stderr() + worker.stderr()
    with psycopg.connect(dsn) as db:
        assert db.execute("SELECT count(*) FROM shop_orders").fetchone() == (1,)
        assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (1,)
