"""examples/fastapi_app.py over HTTP: the order and its job commit together or not at all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

pytestmark = pytest.mark.anyio

pytest.importorskip("fastapi", reason="FastAPI comes with the test extra")

Connection = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
async def client(
    dsn: str, db: Connection, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """The example app, its lifespan running, on the test database."""
    monkeypatch.setenv("ASYNCQ_DSN", dsn)
    db.execute("DROP TABLE IF EXISTS orders")
    from examples.fastapi_app import app

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c,
    ):
        yield c


def counts(db: Connection) -> tuple[int, int]:
    row = db.execute(
        "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM asyncq_jobs)"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


async def test_order_and_job_commit_together(client: httpx.AsyncClient, db: Connection) -> None:
    response = await client.post("/orders", json={"item": "book", "quantity": 2})
    assert response.status_code == 201, response.text
    created = response.json()

    assert counts(db) == (1, 1)
    order = db.execute(
        "SELECT id, job_id, status, xmin::text FROM orders WHERE id = %s", (created["id"],)
    ).fetchone()
    job = db.execute(
        "SELECT id, task_name, queue, status, args, xmin::text FROM asyncq_jobs"
    ).fetchone()
    assert order is not None and job is not None
    assert order[:3] == (created["id"], created["job_id"], "new")
    assert job[:5] == (
        created["job_id"],
        "examples.fastapi_app.send_confirmation",
        "emails",
        "queued",
        {"order_id": created["id"]},
    )
    assert order[3] == job[5], "the order and its job were written by one transaction"


async def test_failing_request_leaves_neither_order_nor_job(
    client: httpx.AsyncClient, db: Connection
) -> None:
    ok = await client.post("/orders", json={"item": "pen", "quantity": 1})
    assert ok.status_code == 201

    failed = await client.post("/orders", json={"item": "lamp", "quantity": 1, "fail": True})
    assert failed.status_code == 500
    assert counts(db) == (1, 1)
    assert db.execute("SELECT item FROM orders").fetchall() == [("pen",)]

    invalid = await client.post("/orders", json={"item": "lamp", "quantity": 0})
    assert invalid.status_code == 422
    assert counts(db) == (1, 1)


async def test_worker_runs_the_job_and_get_shows_it_done(
    client: httpx.AsyncClient, db: Connection
) -> None:
    from examples.fastapi_app import asyncq_app

    created = (await client.post("/orders", json={"item": "mug", "quantity": 3})).json()
    before = (await client.get(f"/orders/{created['id']}")).json()
    assert before["status"] == "new"
    assert before["job"]["status"] == "queued"

    stats = await asyncq_app.run_worker(drain=True, handle_signals=False)
    assert stats.done == 1

    after = await client.get(f"/orders/{created['id']}")
    assert after.status_code == 200
    body = after.json()
    assert (body["item"], body["quantity"], body["status"]) == ("mug", 3, "confirmed")
    assert body["job"] == {
        "id": created["job_id"],
        "status": "done",
        "attempts": 1,
        "last_error": None,
    }
    assert (await client.get("/orders/999999")).status_code == 404
