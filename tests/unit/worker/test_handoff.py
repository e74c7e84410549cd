"""The hand-off of attempts to runners loses none, and serves them in order."""

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


def test_an_item_handed_to_a_runner_cancelled_before_it_took_it_goes_to_the_next() -> None:
    async def main() -> None:
        handoff: Handoff[str] = Handoff()
        cancelled = asyncio.create_task(handoff.get())
        waiting = asyncio.create_task(handoff.get())
        await asyncio.sleep(0)
        handoff.put("attempt")  # handed to the first runner...
        cancelled.cancel()  # ...cancelled before it ran again
        await asyncio.gather(cancelled, return_exceptions=True)
        assert cancelled.cancelled()
        assert await asyncio.wait_for(waiting, 1) == "attempt"

    asyncio.run(main())


def test_with_no_runner_left_waiting_it_goes_back_to_the_front() -> None:
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
