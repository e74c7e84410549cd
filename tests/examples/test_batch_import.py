"""examples/batch_import.py runs end to end against the test database: the report job
deferred after the imports waits for every one of them to end, runs once with
on_parent_failure="run" though two failed, and the publish job after them is cancelled."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "batch_import.py"


async def test_the_report_runs_once_every_import_has_ended(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(90):
        result = await anyio.run_process(
            [sys.executable, str(EXAMPLE)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "the report saw every import end" in output
    assert "report job 13: waiting (waiting_for: after)" in output
    assert "publish job 14: waiting (waiting_for: after)" in output
    assert "imports: 10 done, 2 failed" in output
    assert "loaded: 10 files, 12405 rows" in output

    imports = db.execute(
        "SELECT args->>'path', status::text, attempts FROM asyncq_jobs"
        " WHERE task_name = 'batch_import.import_file' ORDER BY id"
    ).fetchall()
    assert len(imports) == 12
    assert [path for path, status, _ in imports if status == "failed"] == [
        "customers-04.csv",
        "customers-09.csv",
    ]
    assert [(path, attempts) for path, _, attempts in imports if attempts > 1] == [
        ("customers-07.csv", 2)
    ]

    # It ran once, at its first claim: had it run before every import ended, reading an
    # import's outcome with timeout=0 would have failed that attempt.
    [(status, attempts, claims, report)] = db.execute(
        "SELECT status::text, attempts, claims, result FROM asyncq_jobs"
        " WHERE task_name = 'batch_import.report'"
    ).fetchall()
    assert (status, attempts, claims) == ("done", 1, 1)
    assert report == {
        "batch": "2026-11-30",
        "files": 10,
        "rows": 12405,
        "failed": [
            "ValueError: customers-04.csv: line 3 has 2 fields, the header 5",
            "ValueError: customers-09.csv: line 3 has 2 fields, the header 5",
        ],
    }
    [(status, last_error)] = db.execute(
        "SELECT status::text, last_error FROM asyncq_jobs WHERE task_name = 'batch_import.publish'"
    ).fetchall()
    assert status == "cancelled"
    assert last_error.startswith("Cancelled: it runs after job ")
    assert last_error.endswith(", which ended failed")
