"""examples/results.py runs end to end against the test database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "results.py"


async def test_each_wait_ends_as_its_job_did(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(EXAMPLE)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    for line in [
        "quote:  {'items': ['book', 'pen', 'pen'], 'total_cents': 1490}",
        "charge: JobFailed: job 2 failed: ValueError: card declined for order 7",
        "tags:   None",
        "(results.tags) is done, but its result is not stored: the result of results.tags"
        " must be JSON-serialisable: Object of type set is not JSON serializable",
        "slow:   TimeoutError after 0.2s",
        "        'slow but done'",
        "100 waiters at once: totals from 120 to 12000 cents",
        "10**12: JobNotFound: no job has the id 1000000000000",
    ]:
        assert line in output, output
    assert "Traceback" not in output, output
