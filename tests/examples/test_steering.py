"""examples/steering.py runs end to end against the test database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.anyio

STEERING = Path(__file__).resolve().parents[2] / "examples" / "steering.py"


async def test_each_job_ends_as_its_task_asked(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, str(STEERING)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "every job ended as its task asked" in output
    table = {
        parts[1]: parts[2:5]
        for parts in (line.split() for line in output.splitlines())
        if len(parts) > 4 and parts[0].isdigit() and parts[1].startswith("steering.")
    }
    assert table == {
        "steering.fetch_rates": ["done", "2", "2"],
        "steering.ship_when_in_stock": ["done", "1", "3"],
        "steering.import_order": ["failed", "1", "1"],
        "steering.parse_feed": ["failed", "1", "1"],
        "steering.build_report": ["done", "2", "2"],
    }, output
    assert "TimeoutError: attempt 1 of 2 timed out after 0.3s" in output
    assert "Discard: order 7 refers to a deleted customer" in output
