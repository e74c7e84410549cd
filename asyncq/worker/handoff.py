"""The hand-off of claimed attempts to the runners: a first-in, first-out queue whose
waiting runners are woken in the order they came.

It is `asyncio.Queue` without what the dispatcher never uses (a bound, task counting)
and without its look-up of the running loop on each wait, a system call per job before
Python 3.12 (``getpid``).

Waiting runners are woken one at a time: a put wakes one runner if none is being woken
already, and a runner that takes an item while more are left wakes the next. Items stay
in the queue until a runner takes them, so a runner cancelled once woken loses nothing
(it passes its wake-up on). A batch of short attempts is then run by the runner that
woke first, one after the other, without a wake-up per attempt; while attempts wait on
I/O, each one a runner starts wakes the runner for the next.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    def __init__(self) -> None:
        self.items: deque[T] = deque()  # not taken yet: a runner may `take` one itself
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._woken: asyncio.Future[None] | None = None  # woken, and not running yet
        self._loop: asyncio.AbstractEventLoop | None = None

    def put(self, item: T) -> None:
        self.items.append(item)
        if self._woken is None:
            self._wake()

    def put_many(self, items: Sequence[T]) -> None:
        self.items.extend(items)
        if self._woken is None:
            self._wake()

    def put_first_many(self, items: Sequence[T]) -> None:
        """Put ``items``, in their order, ahead of every item waiting."""
        self.items.extendleft(reversed(items))
        if self._woken is None:
            self._wake()

    def take(self) -> T:
        """The first item (there must be one), waking a runner for the next, if any."""
        items = self.items
        item = items.popleft()
        if items and self._woken is None:
            self._wake()
        return item

    async def get(self) -> T:
        while not self.items:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if self._woken is waiter:  # woken, but cancelled before it could take
                    self._woken = None
                    if self.items:
                        self._wake()
                raise
            if self._woken is waiter:
                self._woken = None
        return self.take()

    def _wake(self) -> None:
        """Wake the first runner still waiting, if there is one."""
        waiting = self._waiting
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._woken = waiter
                return
