"""The shape's work alone, with no queue: ``python -m benchmarks.sleep_loop C N WORK_MS``
starts C coroutines on uvloop (as ``asyncq worker`` runs), waits for a line on stdin,
then has each await ``asyncio.sleep(WORK_MS / 1000)`` N times and prints ``done``. The
shape part times it from the line written to ``done`` read: what the sleeps themselves
allow on the machine (timer wake-ups run late, and later as more coroutines share the
loop), the ceiling of any queue's drain of the same jobs."""

from __future__ import annotations

import asyncio
import sys

import uvloop


async def drain(concurrency: int, per_slot: int, work: float) -> None:
    async def slot() -> None:
        for _ in range(per_slot):
            await asyncio.sleep(work)

    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    print("done", flush=True)


def main() -> None:
    concurrency, per_slot, work_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    print("ready", flush=True)
    uvloop.run(drain(concurrency, per_slot, work_ms / 1000))


if __name__ == "__main__":
    main()
