"""examples/sync_tasks.py runs end to end against the test database: defers from code
with no event loop, a transaction that rolls back with its job, def tasks in threads,
and a timed-out one that looks at stop_requested. Its tasks through the plugin too."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import anyio
import pytest

import asyncq
from asyncq.testing import deferred_jobs, drain, inline
from examples import sync_tasks

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "sync_tasks.py"


async def test_the_script_runs_end_to_end(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(SCRIPT)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "rolled back with its job: payment for order 2 declined" in output
    assert re.search(r"export_report: stop requested after \d+ rows, returning", output)
    jobs = [line.split() for line in output.splitlines() if line.startswith("  #")]
    assert [(job[1], job[2]) for job in jobs] == [
        ("make_thumbnail", "done"),
        ("make_thumbnail", "done"),
        ("export_report", "failed"),
        ("make_thumbnail", "done"),  # the committed order's; the rolled-back one's is gone
    ], output
    assert "orders/1.png at 64px" in output and "orders/2.png" not in output


@pytest.fixture
def asyncq_app() -> asyncq.App:
    return sync_tasks.app


async def test_the_tasks_through_the_pytest_plugin(asyncq_test_app: asyncq.App) -> None:
    sync_tasks.make_thumbnail.defer_sync("a.png", width=32)
    assert (await drain(asyncq_test_app)).done == 1
    [job] = await deferred_jobs(sync_tasks.make_thumbnail)
    assert (await asyncq_test_app.result(job.id)).startswith("a.png at 32px, in thread ")


def test_inline_runs_a_def_task_from_synchronous_code() -> None:
    with inline(sync_tasks.app) as queue:
        sync_tasks.export_report.defer_sync(rows=3)
    assert [(job.status, job.result) for job in queue.jobs] == [("done", 3)]
