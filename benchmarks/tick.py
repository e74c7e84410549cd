"""The tick alone, with no queue: how on time a loop's sleeps end, and at what CPU.

    python -m benchmarks.tick [--baseline REF] [--concurrency 8,128] [--rounds 5]

C coroutines on uvloop (as ``asyncq worker`` runs) each spin ``--spin`` µs of CPU (a
job's own work, 15 by default), then ``asyncio.sleep(0.005)``, ``--sleeps`` times
(400): with no tick, with asyncq's tick (`asyncq.worker.tick`) armed as a worker arms
it while one attempt runs, and (``--baseline REF``) with asyncq's tick at the commit
REF; each in a process of its own, in turns, the order rotated from round to round.

Reported per case, medians of the rounds with their spread: the drain's share of the
ideal (C / 5 ms), the mean and 90th percentile of a sleep timed inside its coroutine,
and the process's CPU per sleep (``getrusage``). No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import baseline
from benchmarks.common import ROOT

SLEEP = 0.005


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def drain(concurrency: int, sleeps: int, work: float, package: str | None) -> dict[str, Any]:
    """One drain on the running loop, with ``package``'s tick armed (None: no tick)."""
    tick = None
    if package is not None:
        slots = importlib.import_module(f"{package}.worker.slots").Slots(concurrency)
        slots.take(1)  # an attempt runs: the tick stays armed
        tick = importlib.import_module(f"{package}.worker.tick").Tick(slots)
        tick.start()
        tick.arm()
    durations: list[float] = []

    async def slot() -> None:
        for _ in range(sleeps):
            spin(work)
            began = time.perf_counter()
            await asyncio.sleep(SLEEP)
            durations.append(time.perf_counter() - began)

    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    seconds = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    if tick is not None:
        tick.close()
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    durations.sort()
    count = len(durations)
    return {
        "of_ideal": count / seconds / (concurrency / SLEEP) * 100,
        "mean_ms": sum(durations) / count * 1e3,
        "p90_ms": durations[count * 9 // 10] * 1e3,
        "cpu_us": cpu / count * 1e6,
    }


def child(args: argparse.Namespace) -> None:
    import uvloop

    package = None if args.package == "none" else args.package
    result = uvloop.run(drain(args.c, args.sleeps, args.spin / 1e6, package))
    print(json.dumps(result))


def run_case(package: str, path: str, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.tick", "--child", "--package", package]
    command += ["--c", str(concurrency), "--sleeps", str(args.sleeps), "--spin", str(args.spin)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, str(ROOT)) if p))
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(args: argparse.Namespace) -> None:
    cases = [("no tick", "none", ""), ("asyncq", "asyncq", "")]
    with tempfile.TemporaryDirectory(prefix="asyncq-tick-") as tmp:
        if args.baseline:
            found = baseline.resolve(args.baseline)
            baseline.extract(found, Path(tmp))
            cases.append((found.title, baseline.PACKAGE, tmp))
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            results: dict[str, list[dict[str, Any]]] = {title: [] for title, _, _ in cases}
            for round_ in range(args.rounds):
                shift = round_ % len(cases)
                for title, package, path in cases[shift:] + cases[:shift]:
                    results[title].append(run_case(package, path, concurrency, args))
            print(f"c={concurrency}, {args.spin:g} µs of CPU then 5 ms of sleep, x{args.sleeps}:")
            for title, runs in results.items():
                cells = []
                for key, unit in (
                    ("of_ideal", "%"),
                    ("mean_ms", " ms"),
                    ("p90_ms", " ms"),
                    ("cpu_us", " µs"),
                ):
                    values = [r[key] for r in runs]
                    cells.append(
                        f"{key} {statistics.median(values):.3f}{unit}"
                        f" ({min(values):.3f}-{max(values):.3f})"
                    )
                print(f"  {title:18} " + "  ".join(cells))


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tick", description=__doc__)
    parser.add_argument("--baseline", help="also asyncq's tick at this commit")
    parser.add_argument("--concurrency", default="8,128")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sleeps", type=int, default=400, help="sleeps per coroutine")
    parser.add_argument("--spin", type=float, default=15.0, help="µs of CPU before each sleep")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--package", default="asyncq", help=argparse.SUPPRESS)
    parser.add_argument("--c", type=int, default=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
    else:
        main(args)


if __name__ == "__main__":
    cli()
