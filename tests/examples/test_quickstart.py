"""examples/quickstart.py runs end to end against the test database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.anyio

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


async def test_quickstart_runs_every_job(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, str(QUICKSTART)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "jobs done: 203/203" in output
    assert "all 203 jobs done" in output
    assert "using PostgreSQL at" in output and "(from ASYNCQ_DSN)" in output
    assert "charge_card is done after 2 of 3 attempts" in output
    progress = [line for line in output.splitlines() if line.startswith("jobs done: ")]
    assert len(progress) >= 3, output
