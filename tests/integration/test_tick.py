"""The tick (`asyncq.worker.tick`): while short jobs run, a timerfd wakes the worker's
loop every `PERIOD` (on uvloop, just after every millisecond), so that the jobs' own
timers fire on time; it rests while no job runs and while jobs are long, and the worker
closes it when it stops."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

import asyncq
from asyncq.worker.slots import Slots
from asyncq.worker.tick import AFTER, MILLISECOND, PERIOD, SHORT, Tick
from tests.harness.waiting import until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd: Linux")


def timerfds() -> set[int]:
    """This process's open timerfds."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[timerfd]":
                found.add(int(name))
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return found


def fdinfo(fd: int) -> dict[str, str]:
    with open(f"/proc/self/fdinfo/{fd}") as file:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in file.read().splitlines())}


def nanoseconds(pair: str) -> int:
    seconds, rest = (int(part) for part in pair.strip("()").split(","))
    return seconds * 1_000_000_000 + rest


def interval_ns(fd: int) -> int:
    """A timerfd's period in nanoseconds; 0 while it is disarmed. (Not its ``it_value``,
    which reads 0 between an expiry and its read, too.)"""
    return nanoseconds(fdinfo(fd)["it_interval"])


def coarse_clock_is_libuvs() -> bool:
    """Whether libuv reads CLOCK_MONOTONIC_COARSE (it does where that steps at least
    every millisecond): then uvloop's timers are not due on the millisecond either."""
    return time.clock_getres(6) <= 0.001


def armed_period_ns() -> int:
    """The tick's period on the running loop."""
    on_the_millisecond = isinstance(asyncio.get_running_loop(), uvloop.Loop)
    if on_the_millisecond and not coarse_clock_is_libuvs():
        return round(MILLISECOND * 1e9)
    return round(PERIOD * 1e9)


@pytest.mark.anyio
async def test_a_running_short_job_has_the_tick_armed_and_the_worker_closes_it(
    app: asyncq.App, drain: Any
) -> None:
    before = timerfds()
    seen: list[int] = []

    @app.task(name="tick.short")
    async def short(n: int) -> None:
        await asyncio.sleep(0.002)
        seen.extend(interval_ns(fd) for fd in timerfds() - before)

    await short.defer_many([{"n": n} for n in range(20)])
    stats = await drain(concurrency=4)
    assert stats.done == 20
    assert seen and set(seen) == {armed_period_ns()}
    assert timerfds() == before


def run_on_each_loop(main: Callable[[], Any]) -> None:
    asyncio.run(main())
    uvloop.run(main())


def test_the_tick_rests_once_no_attempt_runs_and_is_not_armed_for_long_attempts() -> None:
    async def main() -> None:
        before = timerfds()  # other tests' dispatchers, started and never stopped
        slots = Slots(4)
        tick = Tick(slots)
        tick.start()
        (fd,) = timerfds() - before
        assert tick.resting and interval_ns(fd) == 0

        slots.take(1)  # an attempt starts
        tick.arm()
        assert not tick.resting and interval_ns(fd) == armed_period_ns()
        await asyncio.sleep(PERIOD * 10)
        assert not tick.resting  # it ticked on: an attempt runs

        slots.give_back(to_write=True)  # none runs: the next tick rests
        await until(lambda: tick.resting, what="the tick to rest")
        assert interval_ns(fd) == 0

        slots.ran(SHORT * 2)  # long attempts: not armed
        slots.take(1)
        tick.arm()
        assert tick.resting and interval_ns(fd) == 0

        tick.close()
        assert not tick.resting and timerfds() == before

    run_on_each_loop(main)


@pytest.mark.anyio
async def test_a_task_in_a_thread_does_not_arm_the_tick(app: asyncq.App, drain: Any) -> None:
    before = timerfds()
    seen: list[int] = []

    @app.task(name="tick.blocking")
    def blocking(n: int) -> None:
        seen.extend(interval_ns(fd) for fd in timerfds() - before)

    await blocking.defer_many([{"n": n} for n in range(5)])
    stats = await drain(concurrency=2)
    assert stats.done == 5
    assert seen and set(seen) == {0}


@pytest.mark.skipif(coarse_clock_is_libuvs(), reason="libuv reads the coarse clock here")
def test_on_uvloop_the_tick_comes_just_after_each_millisecond() -> None:
    async def main() -> None:
        before = timerfds()
        slots = Slots(4)
        slots.take(1)
        tick = Tick(slots)
        tick.start()
        (fd,) = timerfds() - before
        try:
            tick.arm()
            for _ in range(100):
                read_from = time.monotonic_ns()
                info = fdinfo(fd)
                read_by = time.monotonic_ns()
                left = nanoseconds(info["it_value"])
                if left:
                    break
                # A tick fell due that the loop has not read yet: until it does, the kernel
                # says 0 left. Let it read the tick, and look again.
                await asyncio.sleep(0)
            # Armed at an absolute time of CLOCK_MONOTONIC (time.monotonic's), every ms.
            assert info["settime flags"] == "01"
            assert nanoseconds(info["it_interval"]) == 1_000_000
            # it_value is the time left when the kernel read it, between the two clock
            # reads: the next tick falls in that span shifted by it, and one of the
            # milliseconds plus AFTER does too.
            earliest, latest = read_from + left, read_by + left
            after = round(AFTER * 1e9)
            tick_at = (latest - after) // 1_000_000 * 1_000_000 + after
            assert earliest <= tick_at <= latest
        finally:
            tick.close()

    uvloop.run(main())
