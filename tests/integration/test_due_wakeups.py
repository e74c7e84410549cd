"""A worker wakes when a delayed job or a retry comes due, not at its next poll."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest

import asyncq

pytestmark = pytest.mark.anyio


def claim_delay(db: Any, job_id: int) -> float:
    """Seconds between the job's run_at and its claim."""
    row = db.execute(
        "SELECT extract(epoch FROM locked_at - run_at)::float8 FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    return float(row[0])


async def test_delayed_jobs_and_retries_start_when_due_whatever_the_poll_interval(
    app: asyncq.App, db: Any
) -> None:
    done: list[int] = []
    progress = anyio.Event()

    @app.task(name="due.mark")
    async def mark(n: int) -> None:
        done.append(n)
        progress.set()

    @app.task(name="due.flaky", retry=asyncq.Backoff(base=0.6, factor=1, cap=0.6, jitter=0))
    async def flaky(n: int) -> None:
        if asyncq.current_job().attempt == 1:
            raise RuntimeError("first attempt fails")
        done.append(n)
        progress.set()

    async def until_done(n: int) -> None:
        nonlocal progress
        with anyio.fail_after(10):
            while n not in done:
                progress = anyio.Event()
                await progress.wait()

    async with anyio.create_task_group() as tg:
        # Polls once a minute: only knowing when jobs come due gets them claimed in time.
        tg.start_soon(lambda: app.run_worker(poll_interval=60, handle_signals=False))
        await mark.defer(0)
        await until_done(0)  # the worker is up and listening

        delayed = await mark.options(delay=0.5).defer(1)
        later = await mark.options(delay=timedelta(seconds=1.2)).defer(2)
        retried = await flaky.defer(3)
        await until_done(1)
        await until_done(3)
        await until_done(2)
        tg.cancel_scope.cancel()
    for job_id in (delayed, later):
        assert 0 <= claim_delay(db, job_id) < 1.0, claim_delay(db, job_id)
    row = db.execute(
        "SELECT attempts, status::text FROM asyncq_jobs WHERE id = %s", (retried,)
    ).fetchone()
    assert row == (2, "done")
    assert 0 <= claim_delay(db, retried) < 1.0
