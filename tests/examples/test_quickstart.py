"""examples/quickstart.py runs end to end against the test database; its tasks are
tested through the pytest plugin too."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

import asyncq
from asyncq.testing import assert_deferred, deferred_jobs, drain
from examples import quickstart

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


@pytest.fixture
def asyncq_app() -> asyncq.App:
    return quickstart.app


async def test_the_tasks_through_the_pytest_plugin(asyncq_test_app: asyncq.App) -> None:
    """The example's tasks as a user's suite tests them: the plugin's schema, drain."""
    ids = await quickstart.send_email.defer_many([{"order_id": n} for n in range(1, 4)])
    await quickstart.charge_card.defer(order_id=2, amount_cents=4999)
    await assert_deferred(quickstart.charge_card, order_id=2, amount_cents=4999)
    drained = await drain(asyncq_test_app)
    assert (drained.done, drained.failed_attempts) == (4, 1)
    [charge] = await deferred_jobs(quickstart.charge_card)
    assert (charge.status, charge.attempts) == ("done", 2)
    assert charge.last_error and "payment gateway timed out for order 2" in charge.last_error
    assert [job.id for job in await deferred_jobs(quickstart.send_email)] == ids
