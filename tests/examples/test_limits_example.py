"""examples/limits.py runs end to end against the test database, and every limit holds
and is reached."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.anyio

LIMITS = Path(__file__).resolve().parents[2] / "examples" / "limits.py"


async def test_every_limit_holds_and_is_reached(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(LIMITS)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "render_report: at most 2 running at once (limit 2)" in output
    assert "sync_customer: at most 1 running per customer (limit 1)" in output
    assert "send_sms:      at most 5 started in any second (limit 5/s)" in output
    assert "every limit held" in output
