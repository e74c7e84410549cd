"""examples/cancel.py runs end to end against the test database: a worker process aborts
the running job, the queued one is cancelled at once, a paused queue holds its job."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cancel.py"


async def test_the_running_job_is_aborted_in_the_worker_process(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(EXAMPLE)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "every job ended as asked" in output
    assert "'aborting'" in output and "'cancelled'" in output and "'done'" in output
    assert "export of 2026-10: cleaning up" in output  # the aborted job's finally ran
    assert "is queued" in output
