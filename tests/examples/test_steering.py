"""examples/steering.py's tasks, tested as a user of asyncq would test them: with the
pytest plugin (``asyncq_test_app``: the example's App on an empty schema of its own),
`asyncq.testing.drain` to run the jobs with their retries and snoozes made due at once,
and inline mode for what needs no database. The script itself runs once too, in a
process of its own."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import asyncq
from asyncq.testing import assert_deferred, deferred_jobs, drain, inline
from examples import steering

pytestmark = pytest.mark.anyio

STEERING = Path(__file__).resolve().parents[2] / "examples" / "steering.py"


@pytest.fixture
def asyncq_app() -> asyncq.App:
    return steering.app


@pytest.fixture(autouse=True)
def out_of_stock() -> Iterator[None]:
    steering.stock["sku-42"] = 0
    yield
    steering.stock["sku-42"] = 0


async def test_each_job_ends_as_its_task_asked(asyncq_test_app: asyncq.App) -> None:
    await steering.fetch_rates.defer("EUR")
    await steering.ship_when_in_stock.defer("sku-42")
    await steering.import_order.defer(7)
    await steering.parse_feed.defer("https://example.com/feed.xml")
    await steering.build_report.defer("2026-11")
    await assert_deferred(steering.import_order, order_id=7)

    with anyio.fail_after(30):
        drained = await drain(asyncq_test_app)

    ended = {}
    for task in (
        steering.fetch_rates,
        steering.ship_when_in_stock,
        steering.import_order,
        steering.parse_feed,
        steering.build_report,
    ):
        [job] = await deferred_jobs(task)
        ended[task.name] = (job.status, job.attempts, (job.last_error or "-").splitlines()[0])
    assert ended == {
        "steering.fetch_rates": ("done", 2, "Retry: rate limited by the rates service"),
        "steering.ship_when_in_stock": ("done", 1, "-"),
        "steering.import_order": ("failed", 1, "Discard: order 7 refers to a deleted customer"),
        "steering.parse_feed": (
            "failed",
            1,
            "ValueError: https://example.com/feed.xml: line 3 is not valid XML",
        ),
        "steering.build_report": (
            "done",
            2,
            "TimeoutError: attempt 1 of 2 timed out after 0.3s and was cancelled",
        ),
    }
    assert drained.snoozed == 2  # the stock arrived on the third look


async def test_a_retry_comes_back_on_the_next_pass(asyncq_test_app: asyncq.App) -> None:
    await steering.fetch_rates.defer("USD")
    first = await drain(asyncq_test_app, max_passes=2)
    assert (first.passes, first.failed_attempts, first.done) == (2, 1, 1)


async def test_inline_jobs_end_as_their_tasks_ask() -> None:
    with inline(steering.app) as queue:
        await steering.import_order.defer(9)
        await steering.ship_when_in_stock.defer("sku-42")
        assert [job.status for job in queue.jobs] == ["failed", "queued"]
        await drain(steering.app)  # the snoozes, at once
    assert [(job.task_name, job.status, job.attempts) for job in queue.jobs] == [
        ("steering.import_order", "failed", 1),
        ("steering.ship_when_in_stock", "done", 1),
    ]
    assert queue.jobs[0].last_error == "Discard: order 9 refers to a deleted customer"


async def test_the_script_runs_end_to_end(dsn: str) -> None:
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
