"""The hand-off of claimed attempts to the runners: a first-in, first-out queue whose
waiting runners are served in the order they came.

It is `asyncio.Queue` without what the dispatcher never uses (a bound, task counting)
and without its look-up of the running loop on each wait, a system call per job before
Python 3.12 (``getpid``). An item handed to a runner that is cancelled before it could
take it goes to the next runner, or back to the front of the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    def __init__(self) -> None:
        self.items: deque[T] = deque()  # not handed over yet: a runner may pop one itself
        self._waiting: deque[asyncio.Future[T]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def put(self, item: T) -> None:
        if not self._hand(item):
            self.items.append(item)

    async def get(self) -> T:
        if self.items:
            return self.items.popleft()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = self._loop.create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                item = waiter.result()  # handed over, but this runner never took it
                if not self._hand(item):
                    self.items.appendleft(item)
            raise

    def _hand(self, item: T) -> bool:
        """Give ``item`` to the first runner still waiting; False if there is none."""
        waiting = self._waiting
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(item)
                return True
        return False
