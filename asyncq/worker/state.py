"""What the worker's services share: the jobs it holds, its free slots, its wake-up.

The per-job path uses asyncio's own primitives (the worker runs on asyncio or
uvloop): anyio's cost several microseconds a job, which shows at 10,000s of jobs/s.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from dataclasses import dataclass

import anyio

from asyncq.job import Job


class Runner:
    """One of the worker's job runners; its cancel scope covers the job it is running."""

    __slots__ = ("current", "scope")

    def __init__(self) -> None:
        self.current: Held | None = None
        self.scope = anyio.CancelScope()


@dataclass(slots=True, eq=False)
class Held:
    """A job this worker holds: executing, or finished and waiting for its write."""

    job: Job
    executing: bool = True
    lost: bool = False
    cancelled: bool = False
    runner: Runner | None = None

    def cancel(self) -> None:
        """Stop this job: at once if it is running, else before it starts."""
        self.cancelled = True
        if self.runner is not None and self.runner.current is self:
            self.runner.scope.cancel()


class Wakeup:
    """A level-triggered wake-up: many `set` calls before a `wait` fold into one.

    Each `set` wakes one waiter, the one waiting longest; with none waiting, the next
    `wait` returns at once. It sits between a notification and the claim it triggers,
    so it is bare futures and timers: an anyio event in a timeout scope costs tens of
    microseconds more.
    """

    def __init__(self) -> None:
        self._set = False
        self._waiters: deque[asyncio.Future[bool]] = deque()

    def set(self) -> None:
        if not self.nudge():
            self._set = True

    def nudge(self) -> bool:
        """Wake one waiter, if one is waiting; True if one was."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return True
        return False

    async def wait(self, seconds: float | None) -> bool:
        """Wait for a `set` (or a pending one); False after ``seconds`` (None: no limit)."""
        if self._set:
            self._set = False
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = None if seconds is None else loop.call_later(seconds, _expire, waiter)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:  # timed out, or cancelled
                self._waiters.remove(waiter)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Slots:
    """Concurrency slots: taken when a job is claimed, given back when it finishes.

    Outcomes waiting for their write count too once there are more than ``total`` of
    them, so that a worker whose writes fall behind claims less instead of piling up
    running rows.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.unwritten = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.total - self.used - max(0, self.unwritten - self.total)

    def take(self, n: int) -> None:
        self.used += n

    def unclaimed(self, n: int) -> None:
        """Give back slots taken for a claim that brought fewer jobs."""
        if n:
            self.used -= n
            self._freed.set()

    def give_back(self, *, to_write: bool) -> None:
        self.used -= 1
        if to_write:
            self.unwritten += 1
        self._freed.set()

    def written(self) -> None:
        self.unwritten -= 1
        self._freed.set()

    async def wait_free(self, at_least: int) -> None:
        while self.free < min(at_least, self.total):
            self._freed.clear()
            await self._freed.wait()


def backoff_delay(attempt: int, *, base: float = 0.5, cap: float = 15.0) -> float:
    """Reconnect backoff with full jitter, for the worker's own database errors."""
    return random.uniform(base / 2, min(cap, base * math.pow(2, min(attempt, 16))))
