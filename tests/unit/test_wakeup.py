"""The worker's wake-up: a notification wakes one claim loop, and none is lost."""

from __future__ import annotations

import asyncio

from asyncq.worker.state import Wakeup


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
        assert await asyncio.wait_for(second, 1) is True

    asyncio.run(main())


def test_a_nudge_wakes_a_waiter_but_is_not_kept() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        assert wakeup.nudge() is False
        assert await wakeup.wait(0.01) is False
        waiting = asyncio.create_task(wakeup.wait(None))
        await asyncio.sleep(0)
        assert wakeup.nudge() is True
        assert await asyncio.wait_for(waiting, 1) is True

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
