"""The hand-off of attempts to runners loses none, serves them in order, and wakes one
runner at a time."""

from __future__ import annotations

import asyncio

from asyncq.worker.handoff import Handoff


def test_items_and_waiting_runners_are_served_first_come_first_served() -> None:
    async def main() -> None:
        handoff: Handoff[int] = Handoff()
        handoff.put(1)
        handoff.put(2)
        assert [await handoff.get(), await handoff.get()] == [1, 2]
        first = asyncio.create_task(handoff.get())
        second = asyncio.create_task(handoff.get())
        await asyncio.sleep(0)
        handoff.put(3)
        handoff.put(4)
        assert [await first, await second] == [3, 4]

    asyncio.run(main())


def test_a_runner_woken_and_cancelled_before_it_took_an_item_wakes_the_next() -> None:
    async def main() -> None:
        handoff: Handoff[str] = Handoff()
        cancelled = asyncio.create_task(handoff.get())
        waiting = asyncio.create_task(handoff.get())
        await asyncio.sleep(0)
        handoff.put("attempt")  # wakes the first runner...
        cancelled.cancel()  # ...cancelled before it ran again
        await asyncio.gather(cancelled, return_exceptions=True)
        assert cancelled.cancelled()
        assert await asyncio.wait_for(waiting, 10) == "attempt"

    asyncio.run(main())


def test_with_no_runner_left_waiting_the_item_stays_first_in_line() -> None:
    async def main() -> None:
        handoff: Handoff[str] = Handoff()
        cancelled = asyncio.create_task(handoff.get())
        await asyncio.sleep(0)
        handoff.put("first")
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        handoff.put("second")
        assert [await handoff.get(), await handoff.get()] == ["first", "second"]

    asyncio.run(main())


def test_a_put_wakes_one_runner_and_each_runner_that_takes_with_more_left_wakes_the_next() -> None:
    async def main() -> None:
        handoff: Handoff[int] = Handoff()
        runners = [asyncio.create_task(handoff.get()) for _ in range(3)]
        await asyncio.sleep(0)
        for item in range(3):
            handoff.put(item)
        waiting = handoff._waiting
        assert sum(not w.done() for w in waiting) == 2  # one woken, not one per item
        assert await asyncio.wait_for(asyncio.gather(*runners), 10) == [0, 1, 2]

    asyncio.run(main())


def test_a_runner_that_takes_every_item_itself_leaves_the_others_waiting() -> None:
    async def main() -> None:
        handoff: Handoff[int] = Handoff()
        idle = [asyncio.create_task(handoff.get()) for _ in range(3)]
        await asyncio.sleep(0)
        for item in range(4):
            handoff.put(item)
        taken = [handoff.take() for _ in range(4)]  # a runner between attempts, not waiting
        assert taken == [0, 1, 2, 3]
        await asyncio.sleep(0)
        assert not any(task.done() for task in idle)  # the one woken found nothing, waits again
        handoff.put(9)
        done, _ = await asyncio.wait(idle, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert [task.result() for task in done] == [9]
        for task in idle:
            task.cancel()
        await asyncio.gather(*idle, return_exceptions=True)

    asyncio.run(main())
