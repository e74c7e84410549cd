"""examples/periodic.py runs end to end against the test database."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.anyio

PERIODIC = Path(__file__).resolve().parents[2] / "examples" / "periodic.py"


async def test_each_schedule_fires_its_latest_slot_once(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(PERIODIC)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "3 scheduled jobs ran, each for its slot" in output
    fired = re.findall(r"schedule (\S+): slot \S+ made job \d+", output)
    assert sorted(fired) == ["periodic.heartbeat", "report-eu", "report-us"], output
    assert re.search(r"^heartbeat for the slot \d\d:\d\d UTC$", output, re.M), output
    assert re.search(r"^report for eu, slot \d\d:[0-5][05] UTC$", output, re.M), output
    assert re.search(r"^report for us, slot \d\d:00 UTC$", output, re.M), output
