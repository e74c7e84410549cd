"""An App that defers and waits for results through a failover (``test_failover.py``):
``python -m tests.faults.failover_client WAIT_MS [--wait-only]``, with ``$ASYNCQ_DSN``
set, until SIGTERM.

Two loops share the App. One defers ``BATCH`` no-op jobs of the harness app at once
every ``TICK`` seconds: the first of them is written alone, the others gathered into
one INSERT by the defer batcher, both over its kept connection. The other defers a job
that sleeps ``WAIT_MS`` milliseconds and waits for it with ``app.result``, over and
over, so that a result is being waited for when the primary goes away (with
``--wait-only``, this loop alone: the App then reads far more than it writes). Each event is one
JSON line on stdout: ``{"event": "defer" | "result", "began": ..., "ended": ..., "ok":
..., "job": ..., "error": ...}``, times from ``time.time()``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

from tests.harness.app import app, work

BATCH = 3
TICK = 0.1
RESULT_TIMEOUT = 60.0
TAG = -1  # not one of the deferrer's tags


def say(event: str, began: float, **fields: Any) -> None:
    line = {"event": event, "began": began, "ended": time.time(), **fields}
    print(json.dumps(line), flush=True)


async def defer_one(began: float) -> None:
    try:
        job_id = await work.defer(ms=0, tag=TAG)
    except Exception as exc:  # noqa: BLE001 - reported; the loop goes on
        say("defer", began, ok=False, error=f"{type(exc).__name__}: {exc}")
    else:
        say("defer", began, ok=True, job=job_id)


async def defer_steadily() -> None:
    while True:
        began = time.time()
        await asyncio.gather(*(defer_one(began) for _ in range(BATCH)))
        await asyncio.sleep(max(0.0, began + TICK - time.time()))


async def wait_for_results(wait_ms: int) -> None:
    while True:
        began = time.time()
        try:
            job_id = await work.defer(ms=wait_ms, tag=TAG)
        except Exception as exc:  # noqa: BLE001 - reported, then tried again
            say("defer", began, ok=False, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.2)
            continue
        say("defer", began, ok=True, job=job_id)
        began = time.time()
        try:
            await app.result(job_id, timeout=RESULT_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - reported, then on to the next job
            say("result", began, ok=False, job=job_id, error=f"{type(exc).__name__}: {exc}")
        else:
            say("result", began, ok=True, job=job_id)


async def main(wait_ms: int, *, steady: bool) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with app:
        tasks = [asyncio.create_task(wait_for_results(wait_ms))]
        if steady:
            tasks.append(asyncio.create_task(defer_steadily()))
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), steady="--wait-only" not in sys.argv[2:]))
