"""The statements of a profiled drain per job, as benchmarks/start_profile.py computes them
(no database: the figures are made up, only their arithmetic is checked)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.start_profile import per_job


def _statement(query: str, calls: int, rows: int, exec_ms: float, plan_ms: float) -> dict[str, Any]:
    return {
        "query": query,
        "calls": calls,
        "rows": rows,
        "total_exec_time": exec_ms,
        "total_plan_time": plan_ms,
        "shared_blks_hit": 900,
        "shared_blks_read": 100,
        "shared_blks_dirtied": 0,
        "wal_bytes": 50_000,
    }


def test_statements_per_job_and_their_shares() -> None:
    statements = [
        _statement(
            "SELECT * FROM   asyncq_claim($1)", calls=10, rows=1000, exec_ms=30.0, plan_ms=0.0
        ),
        _statement("COMMIT", calls=10, rows=0, exec_ms=9.0, plan_ms=1.0),
        _statement("SELECT never_called()", calls=0, rows=0, exec_ms=0.0, plan_ms=0.0),
    ]
    found = per_job(statements, jobs=1000, seconds=0.08)
    assert found["round_trips_per_job"] == pytest.approx(0.02)
    assert found["server_us_per_job"] == pytest.approx(40.0)
    assert found["server_busy"] == pytest.approx(0.5)
    claim, commit, never = found["statements"]
    assert claim["query"] == "SELECT * FROM asyncq_claim($1)"
    assert claim["rows_per_call"] == 100.0
    assert claim["exec_us_per_job"] == pytest.approx(30.0)
    assert claim["share"] == pytest.approx(0.75)
    assert claim["blocks_per_job"] == 1.0
    assert claim["read_per_job"] == 0.1
    assert claim["wal_bytes_per_job"] == 50.0
    assert commit["plan_us_per_job"] == pytest.approx(1.0)
    assert never["rows_per_call"] == 0.0
