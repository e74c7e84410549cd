"""Where an idle worker's pickup time goes: ``python -m benchmarks.stages --dsn DSN``.

One asyncq worker (concurrency 10, batch 10) in a process of its own, with its stages
stamped: the listener's wake-up, the claim loop running, the claim statement sent and
answered, the claim loop done, the job handed to a runner, the task body. The harness
defers one job at a time, 10-20 ms apart, as the pickup benchmark does, and prints the
median of each step (the first five jobs warm up). The stamps wrap asyncq's internals
from outside; nothing in asyncq knows about them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from typing import Any

from benchmarks.common import drop_database, recreate_database, run_async

STAGES = [
    "sent",
    "woken",
    "claim loop",
    "claim sent",
    "claim answered",
    "claim loop done",
    "handed to runner",
    "task body",
]
WARM_UP = 5


def _stamped_worker(dsn: str, jobs: int) -> None:
    """The worker side: asyncq with its stages stamped; prints the medians and exits."""
    from asyncq import App
    from asyncq.store import Store
    from asyncq.worker import dispatch, producer, wakeup

    marks: dict[str, float] = {}
    rows: list[list[float]] = []

    def wrap_sync(owner: Any, name: str, stage: str) -> None:
        original = getattr(owner, name)

        def stamped(*args: Any, **kwargs: Any) -> Any:
            marks.setdefault(stage, time.time())
            return original(*args, **kwargs)

        setattr(owner, name, stamped)

    def wrap_async(owner: Any, name: str, before: str, after: str) -> None:
        original = getattr(owner, name)

        async def stamped(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            result = await original(*args, **kwargs)
            if result:  # the claim that found the job, not the empty ones around it
                marks[before], marks[after] = started, time.time()
            return result

        setattr(owner, name, stamped)

    wrap_sync(wakeup.Wakeup, "set", "woken")
    wrap_async(producer.Producer, "_claim", "claim loop", "claim loop done")
    wrap_async(Store, "claim", "claim sent", "claim answered")
    wrap_sync(dispatch.Dispatcher, "hold", "handed to runner")

    app = App(dsn, application_name="asyncq-stages")

    @app.task(name="stages.stamp")
    async def stamp(sent_at: float) -> None:
        now = time.time()
        rows.append([sent_at, *(marks.get(s, now) for s in STAGES[1:-1]), now])
        marks.clear()
        if len(rows) == jobs + WARM_UP:
            for i in range(len(STAGES) - 1):
                steps = [(r[i + 1] - r[i]) * 1000 for r in rows[WARM_UP:]]
                print(f"{STAGES[i]} -> {STAGES[i + 1]}: {statistics.median(steps):.3f} ms")
            total = statistics.median((r[-1] - r[0]) * 1000 for r in rows[WARM_UP:])
            print(f"total (defer call to task body): {total:.3f} ms", flush=True)
            os._exit(0)

    async def work() -> None:
        async with app:
            await app.run_worker(concurrency=10, batch_size=10)

    run_async(work)


async def _drive(dsn: str, jobs: int) -> int:
    from asyncq import App

    app = App(dsn, application_name="asyncq-stages-harness")

    @app.task(name="stages.stamp")
    async def stamp(sent_at: float) -> None:
        pass

    async with app:
        await app.migrate()
        command = ["-m", "benchmarks.stages", "--worker", "--dsn", dsn, "--jobs", str(jobs)]
        worker = await asyncio.create_subprocess_exec(sys.executable, *command)
        try:
            await asyncio.sleep(1.5)  # connected, listening, idle
            for _ in range(jobs + WARM_UP):
                await asyncio.sleep(random.uniform(0.010, 0.020))
                await stamp.defer(time.time())
            return await asyncio.wait_for(worker.wait(), 120)
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stages")
    parser.add_argument("--dsn", required=True, help="a superuser DSN (a database is made)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _stamped_worker(args.dsn, args.jobs)
        return

    async def run() -> int:
        dsn = await recreate_database(args.dsn, "stages")
        try:
            return await _drive(dsn, args.jobs)
        finally:
            await drop_database(args.dsn, "stages")

    sys.exit(run_async(run))


if __name__ == "__main__":
    main()
