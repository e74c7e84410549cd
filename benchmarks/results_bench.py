"""Results: what storing them costs a worker, and what waiting for them costs the waiter.

``python -m benchmarks.results_bench [--dsn DSN] [--rounds 3] [--jobs 20000] [--waiters 1000]``

In a database of its own (``asyncq_bench_results``, recreated, dropped at the end):

- worker throughput: one worker process (c=100 b=100) drains ``--jobs`` no-op jobs whose
  task returns None, and as many whose task returns a small dict (`SMALL_RESULT`), in
  turns, the first alternating between rounds; jobs/s of each, medians, and the ratio;
- ``app.result`` for ``--waiters`` concurrent waiters on one App: with a worker process
  serving (c=100 b=100), the App defers that many jobs with ``defer_many`` and waits for
  every result with ``asyncio.gather``. Reported: the time from the defer to the last
  result, the lag from the last job's ``finished_at`` to the last result, the App's
  connections by role in ``pg_stat_activity`` while they wait, and how the waiters heard
  (notification or poll).

Nothing here asserts a timing; numbers go in the report and benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncq
from benchmarks.common import (
    ROOT,
    connect,
    drop_database,
    median,
    recreate_database,
    run_async,
    workers,
)
from benchmarks.measure import throughput, worker_args
from benchmarks.systems import Point
from benchmarks.systems.asyncq_system import NOOP, SMALL_RESULT, AsyncqSystem

DATABASE = "asyncq_bench_results"
RESULTS = ROOT / "benchmarks" / "results"
WAITER_APP = "bench-waiters"


async def worker_rates(system: AsyncqSystem, rounds: int, jobs: int, logs: Path) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"none": [], "result": []}
    for n in range(rounds):
        order = ["none", "result"] if n % 2 == 0 else ["result", "none"]
        for variant in order:
            point = Point(100, 100, variant="" if variant == "none" else "result")
            run = await throughput(system, point, jobs, logs)
            if not run["ok"]:
                raise RuntimeError(run.get("error", "a drain did not complete"))
            rates[variant].append(run["rate"])
            print(f"  round {n + 1}: {variant:>6}: {run['rate']:>9,.0f} jobs/s", flush=True)
    none, result = median(rates["none"]), median(rates["result"])
    pairs = [r / n for n, r in zip(rates["none"], rates["result"], strict=True)]
    assert none is not None and result is not None
    return {
        "rates": rates,
        "median_none": none,
        "median_result": result,
        "ratio": result / none,
        "round_ratios": pairs,
        "median_round_ratio": median(pairs),
        "per_job_us": (1 / result - 1 / none) * 1e6,
    }


async def connections(conn: Any) -> dict[str, int]:
    cur = await conn.execute(
        "SELECT application_name, count(*) FROM pg_stat_activity"
        " WHERE application_name LIKE %s GROUP BY 1 ORDER BY 1",
        (f"{WAITER_APP}:{os.getpid()}%",),
    )
    return {str(name): int(count) for name, count in await cur.fetchall()}


async def waiters_once(system: AsyncqSystem, waiters: int, logs: Path, n: int) -> dict[str, Any]:
    await system.reset()
    point = Point(100, 100, variant="result")
    async with workers(worker_args(system, point, "serve"), 1, logs, f"waiters-{n}") as procs:
        procs[0].go()
        app = asyncq.App(system.dsn, application_name=WAITER_APP)

        @app.task(name=NOOP)
        async def noop() -> None:
            pass

        async with app, await connect(system.dsn) as watch:
            seen: dict[str, int] = {}

            async def watching() -> None:
                while True:
                    for name, count in (await connections(watch)).items():
                        seen[name] = max(seen.get(name, 0), count)
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(watching())
            started = time.perf_counter()
            wall = time.time()
            ids = await noop.defer_many([{}] * waiters)
            answers = await asyncio.gather(*(app.result(i, timeout=300) for i in ids))
            seconds = time.perf_counter() - started
            answered_at = wall + seconds
            watcher.cancel()
            cur = await watch.execute(
                "SELECT extract(epoch FROM max(finished_at))::float8 FROM asyncq_jobs"
                " WHERE id = ANY(%s)",
                (ids,),
            )
            row = await cur.fetchone()
            assert row is not None
            last_done = float(row[0])
            heard = dict(app.results.answered)
    if answers != [SMALL_RESULT] * waiters:
        raise RuntimeError("a waiter got something else than the task's result")
    result = {
        "seconds": seconds,
        "lag_after_last_done_ms": (answered_at - last_done) * 1000,
        "connections": seen,
        "answered": heard,
    }
    print(
        f"  round {n + 1}: {waiters} results in {seconds:.3f}s, the last"
        f" {result['lag_after_last_done_ms']:.1f} ms after the last job was done;"
        f" connections {seen}; answered {heard}",
        flush=True,
    )
    return result


async def main(args: argparse.Namespace) -> None:
    dsn = await recreate_database(args.dsn, DATABASE)
    logs = RESULTS / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    system = AsyncqSystem(dsn)
    try:
        await system.install()
        await system.open()
        print(f"worker throughput, c=100 b=100, {args.jobs:,} jobs a drain", flush=True)
        rates = await worker_rates(system, args.rounds, args.jobs, logs)
        print(f"{args.waiters:,} concurrent waiters of app.result", flush=True)
        waits = [await waiters_once(system, args.waiters, logs, n) for n in range(args.rounds)]
        await system.close()
    finally:
        await drop_database(args.dsn, DATABASE)
    summary = {
        "when": datetime.now(UTC).isoformat(),
        "jobs": args.jobs,
        "waiters": args.waiters,
        "throughput": rates,
        "wait": waits,
        "wait_median_seconds": median([w["seconds"] for w in waits]),
        "wait_median_lag_ms": median([w["lag_after_last_done_ms"] for w in waits]),
    }
    print()
    print(
        f"jobs/s, task returns None:       {rates['median_none']:>9,.0f}  (median of {args.rounds})"
    )
    print(f"jobs/s, task returns a small dict: {rates['median_result']:>9,.0f}")
    print(f"ratio {rates['ratio']:.3f}x; {rates['per_job_us']:+.1f} us per job (from the medians)")
    print(
        f"{args.waiters:,} waiters: defer to last result {summary['wait_median_seconds']:.3f}s,"
        f" last result {summary['wait_median_lag_ms']:.1f} ms after the last finished_at"
        " (medians)"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"results-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(summary, indent=2))
    print(f"written to {out.relative_to(ROOT)}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.results_bench")
    parser.add_argument("--dsn", default=os.environ.get("ASYNCQ_BENCH_DSN"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--waiters", type=int, default=1000)
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("give --dsn (a superuser: it creates and drops a database)")
    return args


if __name__ == "__main__":
    run_async(lambda: main(parse_args(sys.argv[1:])))
