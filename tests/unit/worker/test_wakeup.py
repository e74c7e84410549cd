"""The worker's wake-up: a notification wakes one claim loop, and none is lost."""

from __future__ import annotations

import asyncio
from unittest import mock

from asyncq.worker.wakeup import DueTimes, Wakeup


def test_a_set_before_the_wait_is_kept_and_many_fold_into_one() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        wakeup.set()
        wakeup.set()
        assert await wakeup.wait(5) is True
        assert await wakeup.wait(0.01) is False

    asyncio.run(main())


def test_each_set_wakes_one_waiter_the_longest_waiting_first() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        first = asyncio.create_task(wakeup.wait(None))
        await asyncio.sleep(0)
        second = asyncio.create_task(wakeup.wait(None))
        await asyncio.sleep(0)
        wakeup.set()
        await asyncio.sleep(0.01)
        assert first.done() and not second.done()
        wakeup.set()
        assert await asyncio.wait_for(second, 10) is True

    asyncio.run(main())


def test_a_nudge_wakes_a_waiter_but_is_not_kept() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        assert wakeup.nudge() is False
        assert await wakeup.wait(0.01) is False
        waiting = asyncio.create_task(wakeup.wait(None))
        await asyncio.sleep(0)
        assert wakeup.nudge() is True
        assert await asyncio.wait_for(waiting, 10) is True

    asyncio.run(main())


def test_a_set_after_a_waiter_timed_out_is_not_lost() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        assert await wakeup.wait(0.01) is False
        wakeup.set()
        assert await wakeup.wait(5) is True

    asyncio.run(main())


def test_waiters_that_time_out_or_are_cancelled_leave_nothing_behind() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        for _ in range(100):
            await wakeup.wait(0)
        cancelled = asyncio.create_task(wakeup.wait(None))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert not wakeup._waiters
        wakeup.set()  # no waiter left to take it: kept for the next wait
        assert await wakeup.wait(5) is True

    asyncio.run(main())


def test_a_job_due_later_wakes_a_claim_loop_when_due_and_not_before() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        due = DueTimes(wakeup)
        loop = asyncio.get_running_loop()
        start = loop.time()
        due.add(0.05)
        assert await wakeup.wait(0) is False  # not yet
        assert await wakeup.wait(10) is True
        assert loop.time() - start >= 0.05
        assert due.pending == 0

    asyncio.run(main())


def test_due_times_close_together_share_one_timer_and_each_distinct_one_fires() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        due = DueTimes(wakeup)
        loop = asyncio.get_running_loop()
        # Added at one instant, as a preempted test process could not otherwise promise.
        with mock.patch.object(loop, "time", return_value=loop.time()):
            for seconds in (0.02, 0.021, 0.0205, 0.06, 0.1):
                due.add(seconds)
        assert due.pending == 3
        while due.pending:  # each fires and wakes a claim loop (wake-ups close together fold)
            assert await wakeup.wait(10) is True

    asyncio.run(main())


def test_past_the_limit_the_latest_due_times_are_dropped_and_overflow_is_said() -> None:
    async def main() -> None:
        due = DueTimes(Wakeup())
        due.LIMIT = 3
        for seconds in (10, 20, 30):
            due.add(seconds)
        due.add(40)  # later than every timer: dropped
        assert due.pending == 3 and due.overflowed
        due.overflowed = False
        due.add(5)  # earlier: takes the place of the latest
        assert due.pending == 3 and due.overflowed
        due.clear()
        assert due.pending == 0

    asyncio.run(main())
