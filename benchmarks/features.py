"""Throughput with every feature switched on, and each feature's own cost.

``python -m benchmarks.features --dsn DSN [--rounds 3] [--seconds 5] [--concurrency 100]``

Each run fills a fresh jobs table with the same backlog of no-op jobs (nine in ten of
the task ``free``, one in twenty each of ``capped`` and ``rated``), far more than a run
can finish, starts one worker process (``--concurrency``, ``--batch-size`` alike) of
`benchmarks.features_app`, and counts the jobs done in a window after a warm-up. The
configurations, in turns within each round so that a drift of the machine's load weighs
on all alike:

- ``plain``: none of the features below;
- ``metrics``: the worker serves Prometheus metrics (``--metrics-port``), scraped every
  second;
- ``limits``: ``capped`` limited to 50 at once and ``rated`` to 1,000 starts a second
  (every claim is then the limited one);
- ``schedules``: 100 schedules, every minute;
- ``results``: a process holds 100 ``app.result`` waiters on jobs of the backlog at all
  times (each finished one is replaced), so each completion is announced;
- ``all``: all of them at once.

It prints each run, the medians, and each configuration against ``plain`` (the ratio of
the medians, and the median of each round's own ratio).

``--baseline REF`` also runs each configuration with asyncq as it was at the commit REF
(`benchmarks.baseline`), back to back with the working tree's in each round (the first
alternating between rounds), and prints each configuration against its baseline. Each
runs on a database of its own, migrated by its own asyncq.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psycopg

from benchmarks import baseline
from benchmarks.common import ROOT, with_dbname

DB = "asyncq_bench_features"
WARMUP = 1.0
CONFIGS = {
    "plain": (),
    "metrics": ("metrics",),
    "limits": ("limits",),
    "schedules": ("schedules",),
    "results": ("results",),
    "all": ("metrics", "limits", "schedules", "results"),
}

WAITERS = """
import asyncio, importlib, os, random, sys
asyncq = importlib.import_module(os.environ.get("BENCH_ASYNCQ", "asyncq"))
app = asyncq.App(os.environ["ASYNCQ_DSN"])

async def wait_one(ids):
    while True:
        try:
            await app.result(random.choice(ids), timeout=30)
        except Exception:
            pass

async def main():
    async with app:
        async with app.connection() as conn:
            rows = await (await conn.execute("SELECT id FROM asyncq_jobs ORDER BY id")).fetchall()
        ids = [r[0] for r in rows]
        print("ready", flush=True)
        await asyncio.gather(*(wait_one(ids) for _ in range(100)))

asyncio.run(main())
"""


def fill(dsn: str, jobs: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE asyncq_jobs, asyncq_rate_starts, asyncq_result_listeners")
        conn.execute(
            "INSERT INTO asyncq_jobs (task_name)"
            " SELECT CASE n %% 20 WHEN 0 THEN 'capped' WHEN 1 THEN 'rated' ELSE 'free' END"
            "   FROM generate_series(1, %s) AS n",
            (jobs,),
        )
        conn.execute("VACUUM ANALYZE asyncq_jobs")


def done(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'").fetchone()
    return int(row[0]) if row else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(
    dsn: str, features: tuple[str, ...], package: Path | None
) -> tuple[dict[str, str], str]:
    """The environment of an asyncq command for ``features``, and the module to run: with
    ``package``, that asyncq_baseline."""
    env = dict(os.environ, ASYNCQ_DSN=dsn, BENCH_FEATURES=",".join(features))
    module = "asyncq"
    if package is not None:
        module = env["BENCH_ASYNCQ"] = package.name
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package.parent), str(ROOT)]))
    return env, module


def run(
    dsn: str,
    features: tuple[str, ...],
    *,
    seconds: float,
    concurrency: int,
    package: Path | None = None,
) -> float:
    """Jobs done per second in the window; with ``package``, by that asyncq_baseline's
    worker."""
    env, module = environment(dsn, features, package)
    args = [sys.executable, "-m", module, "worker", "benchmarks.features_app:app"]
    args += ["--concurrency", str(concurrency), "--batch-size", str(min(concurrency, 100))]
    port = None
    if "metrics" in features:
        port = free_port()
        args += ["--metrics-port", str(port)]
    helpers = []
    if "results" in features:
        waiters = subprocess.Popen(
            [sys.executable, "-c", WAITERS], env=env, cwd=ROOT, stdout=subprocess.PIPE
        )
        assert waiters.stdout is not None
        waiters.stdout.readline()  # its waiters are about to register
        helpers.append(waiters)
    worker = subprocess.Popen(
        args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        while not done(dsn):  # the worker has started
            if worker.poll() is not None:
                assert worker.stderr is not None
                error = worker.stderr.read().decode(errors="replace").strip()
                raise SystemExit(
                    f"the worker of {features or ('plain',)} exited ({worker.returncode})"
                    f" before it finished a job:\n{error}"
                )
            time.sleep(0.05)
        time.sleep(WARMUP)
        before, at = done(dsn), time.monotonic()
        while time.monotonic() - at < seconds:
            time.sleep(1.0)
            if port is not None:  # scraped as Prometheus would, every second
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        after, end = done(dsn), time.monotonic()
    finally:
        for proc in [worker, *helpers]:
            proc.send_signal(signal.SIGTERM)
        for proc in [worker, *helpers]:
            proc.wait(30)
    return (after - before) / (end - at)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.features")
    parser.add_argument("--dsn", default=os.environ.get("ASYNCQ_BENCH_DSN"), required=False)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--only", default=",".join(CONFIGS), help="configurations to run")
    parser.add_argument("--baseline", help="a commit whose asyncq runs each configuration too")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn or $ASYNCQ_BENCH_DSN")
    names = [name for name in args.only.split(",") if name]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configurations: {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="asyncq-baseline-") as scratch:
        package = None
        if args.baseline:
            try:
                package = baseline.extract(baseline.resolve(args.baseline), Path(scratch))
            except (ValueError, RuntimeError) as exc:
                parser.error(f"--baseline: {exc}")
        measure(args, names, package)


def measure(args: argparse.Namespace, names: list[str], package: Path | None) -> None:
    # The baseline runs on a database of its own, migrated by its own asyncq: a change to
    # a migration's SQL is measured too
    databases = {None: DB}
    if package is not None:
        databases[package] = f"{DB}_base"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        for name in databases.values():
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
    for asyncq_package, name in databases.items():
        dsn = with_dbname(args.dsn, name)
        env, module = environment(dsn, ("limits", "schedules"), asyncq_package)
        migrate = [sys.executable, "-m", module, "migrate", "benchmarks.features_app:app"]
        subprocess.run(migrate, env=env, cwd=ROOT, check=True, capture_output=True)
    rates: dict[str, list[float]] = {name: [] for name in names}
    before: dict[str, list[float]] = {name: [] for name in names}
    # The baseline's run of each configuration and the working tree's back to back, the
    # first alternating between rounds (whichever ran second came out slower by 5-10%
    # with identical code)
    turns: list[tuple[Path | None, dict[str, list[float]], str]] = []
    if package is not None:
        turns.append((package, before, "@base"))
    turns.append((None, rates, ""))
    try:
        for number in range(1, args.rounds + 1):
            order = names if number % 2 else names[::-1]
            for name in order:
                for asyncq_package, into, suffix in turns if number % 2 else turns[::-1]:
                    dsn = with_dbname(args.dsn, databases[asyncq_package])
                    fill(dsn, args.jobs)
                    rate = run(
                        dsn,
                        CONFIGS[name],
                        seconds=args.seconds,
                        concurrency=args.concurrency,
                        package=asyncq_package,
                    )
                    into[name].append(rate)
                    print(f"round {number} {name + suffix:<15} {rate:8.0f} jobs/s", flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            for name in databases.values():
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    print()
    summarise(names, rates)
    if package is not None:
        print(f"\nbaseline {args.baseline}:")
        summarise(names, before, against=rates)


def ratio(ours: list[float], theirs: list[float]) -> str:
    """Ours against theirs: the ratio of the medians, and the median of each round's."""
    rounds = [o / t for o, t in zip(ours, theirs, strict=True)]
    return (
        f"{statistics.median(ours) / statistics.median(theirs):.2f}x"
        f" (rounds' ratios, median {statistics.median(rounds):.2f}x)"
    )


def summarise(
    names: list[str], rates: dict[str, list[float]], against: dict[str, list[float]] | None = None
) -> None:
    """Each configuration's median and runs, against ``plain``; with ``against`` (the
    working tree's, when ``rates`` are the baseline's), the working tree against them."""
    plain = rates.get("plain")
    for name in names:
        runs = " ".join(f"{r:.0f}" for r in rates[name])
        line = f"{name:<10} median {statistics.median(rates[name]):8.0f} jobs/s  (runs {runs})"
        if plain and name != "plain":
            line += f"  vs plain {ratio(rates[name], plain)}"
        if against is not None:
            line += f"  working tree vs baseline {ratio(against[name], rates[name])}"
        print(line)


if __name__ == "__main__":
    main()
