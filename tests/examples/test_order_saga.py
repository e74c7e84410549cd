"""examples/order_saga.py runs end to end against the test database: each order's steps
commit their SQL once, a failed attempt repeats none of them, and a rejected order is
undone by its compensations, each once."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "order_saga.py"


async def test_the_saga_charges_once_and_undoes_rejected_orders(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(90):
        result = await anyio.run_process(
            [sys.executable, str(EXAMPLE)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "every order ended as its saga decided" in output
    assert "ConnectionError: the carrier's API timed out" in output  # order 1's first attempt
    assert "3 charges for 3 orders: charge() ran 3 times, ship() 3 times" in output

    orders = db.execute("SELECT id, status, note FROM saga_orders ORDER BY id").fetchall()
    assert orders == [
        (1, "shipped", "TRK-0001"),
        (2, "cancelled", "2 sofa ordered, 1 in stock"),
        (3, "cancelled", "the carrier does not deliver to Atlantis"),
    ]
    payments = db.execute(
        "SELECT order_id, kind, amount_cents FROM saga_payments ORDER BY id"
    ).fetchall()
    assert sorted(payments) == [
        (1, "charge", 2500),
        (2, "charge", 90000),
        (2, "refund", 90000),
        (3, "charge", 2500),
        (3, "refund", 2500),
    ]
    assert db.execute("SELECT sku, available FROM saga_stock ORDER BY sku").fetchall() == [
        ("lamp", 4),  # order 3's lamp went back on the shelf
        ("sofa", 1),
    ]

    jobs = db.execute(
        "SELECT (args->>'order_id')::int, status::text, attempts, result->>'status',"
        " (SELECT array_agg(s.name || '@' || s.attempt ORDER BY s.position)"
        "    FROM asyncq_steps s WHERE s.job_id = j.id)"
        " FROM asyncq_jobs j WHERE task_name = 'saga.place_order' ORDER BY 1"
    ).fetchall()
    assert jobs == [
        (1, "done", 2, "shipped", ["charge@1", "reserve@1", "ship@2", "confirm@2"]),
        (2, "done", 1, "cancelled", ["charge@1", "reserve@1", "refund@1", "cancel@1"]),
        (
            3,
            "done",
            1,
            "cancelled",
            ["charge@1", "reserve@1", "ship@1", "release@1", "refund@1", "cancel@1"],
        ),
    ]
