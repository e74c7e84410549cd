"""The shape's work alone, with no queue: ``python -m benchmarks.sleep_loop C N WORK_MS
[tick]`` starts C coroutines on uvloop (as ``asyncq worker`` runs), waits for a line on
stdin, then has each await ``asyncio.sleep(WORK_MS / 1000)`` N times and prints ``done``.
The shape part times it from the line written to ``done`` read: what the sleeps themselves
allow on the machine (timer wake-ups run late, and later as more coroutines share the
loop).

With ``tick``, the loop is woken as asyncq's worker wakes it while short jobs run
(`asyncq.worker.tick`, armed for the whole drain), so that the timers fire on time: the
ceiling of a queue's drain with what the worker does to its loop, and nothing else."""

from __future__ import annotations

import asyncio
import sys

import uvloop

from asyncq.worker.slots import Slots
from asyncq.worker.tick import Tick


async def drain(concurrency: int, per_slot: int, work: float, *, tick: bool) -> None:
    async def slot() -> None:
        for _ in range(per_slot):
            await asyncio.sleep(work)

    ticking: Tick | None = None
    if tick:
        slots = Slots(concurrency)
        slots.take(1)  # a job runs: the tick stays armed
        slots.ran(work)
        ticking = Tick(slots)
        ticking.start()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if ticking is not None:
        ticking.arm()
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    if ticking is not None:
        ticking.close()
    print("done", flush=True)


def main() -> None:
    concurrency, per_slot, work_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    tick = sys.argv[4:5] == ["tick"]
    print("ready", flush=True)
    uvloop.run(drain(concurrency, per_slot, work_ms / 1000, tick=tick))


if __name__ == "__main__":
    main()
