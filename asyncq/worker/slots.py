"""The worker's concurrency slots, shared by the claim loops and the dispatcher."""

from __future__ import annotations

import asyncio

# Jobs are short while their attempts last less than this on average (a moving average).
SHORT_JOB = 0.05
# The weight of the latest attempt in that average.
_WEIGHT = 0.1


class Slots:
    """Concurrency slots: taken when a job is claimed, given back when it finishes.

    Outcomes waiting for their write count too once there are more than ``total`` of
    them, so that a worker whose writes fall behind claims less instead of piling up
    running rows.

    While jobs are short, ``ahead`` more may be claimed than ``total``: they wait for a
    runner, so that a runner that ends a job finds the next one here rather than waiting
    a claim's round trip for it, and the claim overlaps the jobs. With longer jobs none
    are claimed ahead: such a job could wait on this worker while another sits idle, and
    a round trip is little against them.
    """

    def __init__(self, total: int, *, ahead: int = 0) -> None:
        self.total = total
        self.ahead = ahead
        self.ahead_now = 0  # ``ahead`` while jobs are short, else 0
        self.used = 0
        self.unwritten = 0
        self.average: float | None = None  # seconds an attempt lasts, on average
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.total + self.ahead_now - self.used - max(0, self.unwritten - self.total)

    def ran(self, seconds: float) -> None:
        """An attempt ran for ``seconds``: jobs may have become short, or long."""
        average = self.average
        average = seconds if average is None else average + _WEIGHT * (seconds - average)
        self.average = average
        ahead = self.ahead if average < SHORT_JOB else 0
        if ahead != self.ahead_now:
            self.ahead_now = ahead
            self._freed.set()

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
