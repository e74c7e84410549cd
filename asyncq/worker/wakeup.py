"""When the claim loops wake: a notification, a poll, or a job coming due.

The per-job path uses asyncio's own primitives (the worker runs on asyncio or
uvloop): anyio's cost several microseconds a job, which shows at 10,000s of jobs/s.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque


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


class DueTimes:
    """Wakes the claim loops when jobs that are not ready yet come due.

    A notification of a delayed job or a retry says how far ahead it is due; `add`
    sets one loop timer per distinct due time (times closer than `COALESCE` share
    one), a few milliseconds late so that the claim finds the job ready. At most
    `LIMIT` timers wait; past that the latest are dropped and `overflowed` is set, so
    that the listener asks the database for the next due time once the timers run out.
    """

    COALESCE = 0.005
    LATE = 0.003
    LIMIT = 10_000

    def __init__(self, wakeup: Wakeup) -> None:
        self.wakeup = wakeup
        self.overflowed = False
        self._times: list[float] = []
        self._timers: dict[float, asyncio.TimerHandle] = {}

    def add(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time() + max(seconds, 0.0) + self.LATE
        times = self._times
        i = bisect.bisect_left(times, at)
        if (i < len(times) and times[i] - at < self.COALESCE) or (
            i > 0 and at - times[i - 1] < self.COALESCE
        ):
            return
        if len(times) >= self.LIMIT:
            self.overflowed = True
            if i == len(times):
                return
            self._timers.pop(times.pop()).cancel()
        times.insert(i, at)
        self._timers[at] = loop.call_at(at, self._fire, at)

    def _fire(self, at: float) -> None:
        self._timers.pop(at, None)
        i = bisect.bisect_left(self._times, at)
        if i < len(self._times) and self._times[i] == at:
            del self._times[i]
        self.wakeup.set()

    @property
    def pending(self) -> int:
        return len(self._times)

    def clear(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._times.clear()
