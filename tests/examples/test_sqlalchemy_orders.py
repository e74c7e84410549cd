"""examples/sqlalchemy_orders.py as a user runs it: its output, and what it left."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tests.harness.processes import REPO

pytest.importorskip("sqlalchemy", reason="SQLAlchemy comes with the test extra")

EXPECTED = [
    r"committed:    order 1 \(book\) and its job (?P<book>\d+)",
    r"rolled back:  payment declined \(on purpose\); orders: 1, jobs: 1",
    # Order 2 was the rolled-back one: a sequence does not roll back.
    r"sync Session: order 3 \(pen\) and its job (?P<pen>\d+)",
    r"worker:       2 jobs done",
    r"  order 1 book  confirmed, job (?P=book)",
    r"  order 3 pen   confirmed, job (?P=pen)",
]


def run(dsn: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ASYNCQ_TEST_DSN"}
    return subprocess.run(
        [sys.executable, "examples/sqlalchemy_orders.py"],
        env={**env, "ASYNCQ_DSN": dsn},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_example_prints_what_it_did_twice_over(
    dsn: str, db: psycopg.Connection[tuple[Any, ...]]
) -> None:
    try:
        for _ in range(2):  # a second run starts again from an empty table
            done = run(dsn)
            assert done.returncode == 0, done.stderr
            assert re.fullmatch("\n".join(EXPECTED) + "\n", done.stdout), done.stdout
        jobs = db.execute(
            "SELECT status, count(*) FROM asyncq_jobs WHERE queue = 'sqlalchemy-example'"
            " GROUP BY status"
        ).fetchall()
        assert jobs == [("done", 2)]
    finally:
        db.execute("DROP TABLE IF EXISTS example_orders")
