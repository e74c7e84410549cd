"""The worker's concurrency slots, shared by the claim loops and the dispatcher."""

from __future__ import annotations

import asyncio


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
