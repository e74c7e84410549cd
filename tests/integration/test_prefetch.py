"""Claiming ahead: while jobs are short, a worker holds up to ``prefetch`` jobs more than
its concurrency, waiting for a runner; with long jobs none, and of limited tasks none."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

import asyncq
from asyncq.job import Job
from asyncq.worker.observer import AttemptEnded, Observer
from asyncq.worker.slots import HOLD, Slots

pytestmark = pytest.mark.anyio


class Watch(Observer):
    """The most jobs that ran at once, and the most that were claimed and not ended."""

    def __init__(self, app: asyncq.App) -> None:
        self.running_now = self.most_running = 0
        self.held = self.most_held = 0
        app._observers.append(self)

    def claimed(self, jobs: Sequence[Job], seconds: float) -> None:
        self.held += len(jobs)
        self.most_held = max(self.most_held, self.held)

    def running(self, job: Job) -> AttemptEnded:
        self.running_now += 1
        self.most_running = max(self.most_running, self.running_now)

        def ended(*_: object) -> None:
            self.running_now -= 1
            self.held -= 1

        return ended

    async def job(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def test_short_jobs_are_claimed_ahead_and_no_more_run_at_once(
    app: asyncq.App, drain: Any
) -> None:
    watch = Watch(app)

    @app.task(name="ahead.short")
    async def short(n: int) -> None:
        await watch.job(0.002)

    await short.defer_many([{"n": n} for n in range(200)])
    stats = await drain(concurrency=4, batch_size=4, prefetch=4)
    assert stats.done == 200
    assert watch.most_running == 4
    assert 4 < watch.most_held <= 8


async def test_long_jobs_are_not_claimed_ahead(app: asyncq.App, drain: Any) -> None:
    watch = Watch(app)

    @app.task(name="ahead.long")
    async def long(n: int) -> None:
        await watch.job(HOLD * 5)

    await long.defer_many([{"n": n} for n in range(12)])
    stats = await drain(concurrency=2, batch_size=2, prefetch=4)
    assert stats.done == 12
    assert watch.most_held == 2


async def test_prefetch_zero_claims_only_what_can_run(app: asyncq.App, drain: Any) -> None:
    watch = Watch(app)

    @app.task(name="ahead.none")
    async def none(n: int) -> None:
        await watch.job(0.002)

    await none.defer_many([{"n": n} for n in range(100)])
    stats = await drain(concurrency=4, batch_size=4, prefetch=0)
    assert stats.done == 100
    assert watch.most_held == 4


async def test_a_limited_task_is_never_claimed_ahead(app: asyncq.App, drain: Any) -> None:
    watch = Watch(app)

    # Claimed ahead, a job would count against its task's limit while it waited: with
    # room for 4 across every worker, this one would hold 4 and run 2.
    @app.task(name="ahead.limited", concurrency=4)
    async def limited(n: int) -> None:
        await watch.job(0.002)

    await limited.defer_many([{"n": n} for n in range(100)])
    stats = await drain(concurrency=2, batch_size=2, prefetch=2)
    assert stats.done == 100
    assert watch.most_held == 2


async def test_with_limits_other_tasks_are_claimed_ahead_and_limited_ones_never_wait(
    app: asyncq.App, drain: Any
) -> None:
    watch = Watch(app)
    waiting_limited = 0  # claimed, not started
    passed_over: list[int] = []  # other jobs started while a limited one waited

    class Order(Observer):
        def claimed(self, jobs: Sequence[Job], seconds: float) -> None:
            nonlocal waiting_limited
            waiting_limited += sum(job.task_name == "ahead.capped" for job in jobs)

        def running(self, job: Job) -> AttemptEnded:
            nonlocal waiting_limited
            if job.task_name == "ahead.capped":
                waiting_limited -= 1
            elif waiting_limited:
                passed_over.append(job.id)
            return lambda *_: None

    app._observers.append(Order())

    @app.task(name="ahead.capped", concurrency=3)
    async def capped(n: int) -> None:
        await watch.job(0.002)

    @app.task(name="ahead.free")
    async def free(n: int) -> None:
        await watch.job(0.002)

    for n in range(150):
        await capped.defer(n=n)
        await free.defer(n=n)
    stats = await drain(concurrency=4, batch_size=4, prefetch=8)
    assert stats.done == 300
    assert watch.most_running == 4
    assert watch.most_held > 4  # the free task's jobs were claimed ahead
    assert passed_over == []  # a limited job claimed ran before any held ahead


async def test_a_limited_job_left_for_want_of_a_free_runner_is_claimed_once_one_frees(
    app: asyncq.App,
) -> None:
    """A worker that polls once a minute, its runners busy with jobs claimed ahead: the
    limited job that its claims left is claimed once a runner frees, not at the poll."""
    done = anyio.Event()

    @app.task(name="ahead.busy")
    async def busy(n: int) -> None:
        await asyncio.sleep(0.005)

    @app.task(name="ahead.last", concurrency=5)
    async def last() -> None:
        done.set()

    await busy.defer_many([{"n": n} for n in range(200)])
    await last.defer()
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: app.run_worker(
                concurrency=2, batch_size=4, prefetch=8, poll_interval=60, handle_signals=False
            )
        )
        with anyio.fail_after(20):
            await done.wait()
        tg.cancel_scope.cancel()


def test_slots_hold_the_work_of_a_short_while_beyond_the_runners() -> None:
    slots = Slots(4, ahead=100)
    assert slots.free == 4  # nothing known yet: no claiming ahead
    slots.ran(HOLD / 1000)
    assert slots.free == 104  # very short jobs: the most the option allows
    for _ in range(100):
        slots.ran(HOLD / 10)
    assert slots.free == 4 + 40  # what the runners end in HOLD seconds at that length
    for _ in range(100):
        slots.ran(HOLD * 3)
    assert slots.free == 4 + 1  # four runners end 1.3 such jobs in HOLD seconds
    for _ in range(100):
        slots.ran(HOLD * 10)
    assert slots.free == 4  # none
    slots.take(4)
    assert slots.free == 0
