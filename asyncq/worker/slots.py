"""The worker's concurrency slots, shared by the claim loops and the dispatcher."""

from __future__ import annotations

import asyncio

# Seconds of work a worker holds beyond what it runs: its runners would end that many
# jobs' worth of attempts in this time, at their average length.
HOLD = 0.02
# The weight of the latest attempt in that average (a moving average).
_WEIGHT = 0.1


class Slots:
    """Concurrency slots: taken when a job is claimed, given back when it finishes.

    Outcomes waiting for their write count too once there are more than ``total`` of
    them, so that a worker whose writes fall behind claims less instead of piling up
    running rows.

    While jobs are short, more may be claimed than ``total``: they wait for a runner, so
    that a runner that ends a job finds the next one here rather than waiting a claim's
    round trip for it, and the claim overlaps the jobs. How many: as many as the runners
    end in `HOLD` seconds at the average length of an attempt, at most ``ahead``. So no
    job claimed ahead waits much longer than `HOLD` while another worker might be idle,
    and jobs that last longer than that are not claimed ahead at all (a round trip is
    little against them).
    """

    def __init__(self, total: int, *, ahead: int = 0) -> None:
        self.total = total
        self.ahead = ahead
        self.ahead_now = 0  # ``ahead`` while jobs are short, else 0
        self.used = 0
        self.unwritten = 0
        self.ended = 0  # attempts ended so far
        self.writes = 0  # writes of outcomes so far
        self.average: float | None = None  # seconds an attempt lasts, on average
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        room = self.total + self.ahead_now
        return room - self.used - max(0, self.unwritten - room)

    def ran(self, seconds: float) -> None:
        """An attempt ran for ``seconds``: jobs may have become short, or long."""
        average = self.average
        average = seconds if average is None else average + _WEIGHT * (seconds - average)
        self.average = average
        budget = self.total * HOLD  # runner-seconds of work to hold beyond what runs
        ahead = self.ahead if average * self.ahead <= budget else int(budget / average)
        if ahead != self.ahead_now:
            if ahead > self.ahead_now:
                self._freed.set()
            self.ahead_now = ahead

    def take(self, n: int) -> None:
        self.used += n

    def unclaimed(self, n: int) -> None:
        """Give back slots taken for a claim that brought fewer jobs."""
        if n:
            self.used -= n
            self._freed.set()

    def give_back(self, *, to_write: bool) -> None:
        self.used -= 1
        self.ended += 1
        if to_write:
            self.unwritten += 1
        self._freed.set()

    def written(self, n: int) -> None:
        self.unwritten -= n
        self.writes += 1
        self._freed.set()

    def enough(self, at_least: int) -> bool:
        """Whether ``at_least`` slots are free, or half the room (the slots with the jobs
        held ahead), if that is less."""
        return self.free >= max(1, min(at_least, (self.total + self.ahead_now) // 2))

    async def wait_free(self, at_least: int) -> None:
        while not self.enough(at_least):
            self._freed.clear()
            await self._freed.wait()

    async def wait_ended(self, ended: int) -> None:
        """Wait until more than ``ended`` attempts have ended."""
        while self.ended == ended:
            self._freed.clear()
            await self._freed.wait()

    async def wait_written(self, writes: int) -> None:
        """Wait until more than ``writes`` writes of outcomes have ended."""
        while self.writes == writes:
            self._freed.clear()
            await self._freed.wait()
