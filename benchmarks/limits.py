"""Throughput of the plain claim against the claim with limits active.

``python -m benchmarks.limits --dsn DSN [--rounds 3] [--seconds 5] [--workers 2]``

Each round fills a fresh jobs table with the same backlog: no-op jobs of three tasks,
interleaved (3 of ``free``, 1 of ``capped``, 1 of ``rated`` in every 5), far more than
a round can run. It then runs worker processes of `benchmarks.limits_app` for a fixed
time, once with no limit declared (the plain claim) and once with ``capped`` at
concurrency 50 and ``rated`` at 1,000/s (every claim is then the limited one), in
turns, and counts the jobs done in the window after a warm-up. It prints each round
and the medians; the ratio is limited / plain (of the medians, and the median of
each round's own ratio, which a machine whose load drifts disturbs less).

A fifth of the backlog is the rate-limited task's: when the workers could start more
of them than 1,000 a second, the rest wait at the head of the queue, and every claim
passes over them (the ready index does not hold the task name). ``BENCH_RATE=1000000/s``
measures the limited claim without that cost.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import psycopg

from benchmarks.common import ROOT, with_dbname

DB = "asyncq_bench_limits"
WARMUP = 1.0


def fill(dsn: str, jobs: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE asyncq_jobs, asyncq_rate_starts")
        conn.execute(
            "INSERT INTO asyncq_jobs (task_name)"
            " SELECT (ARRAY['free', 'free', 'free', 'capped', 'rated'])[n %% 5 + 1]"
            "   FROM generate_series(1, %s) AS n",
            (jobs,),
        )
        conn.execute("VACUUM ANALYZE asyncq_jobs")


def done(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT task_name, count(*) FROM asyncq_jobs WHERE status = 'done' GROUP BY 1"
        ).fetchall()
    return dict(rows)


def run(dsn: str, *, limited: bool, seconds: float, workers: int, concurrency: int) -> float:
    """Jobs done per second in the window, by ``workers`` worker processes."""
    env = dict(os.environ, ASYNCQ_DSN=dsn, BENCH_LIMITS="1" if limited else "0")
    args = [sys.executable, "-m", "asyncq", "worker", "benchmarks.limits_app:app"]
    args += ["--concurrency", str(concurrency), "--batch-size", str(concurrency)]
    procs = [
        subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(workers)
    ]
    try:
        while not done(dsn):  # the workers have started
            time.sleep(0.05)
        time.sleep(WARMUP)
        before, at = sum(done(dsn).values()), time.monotonic()
        time.sleep(seconds)
        after, end = done(dsn), time.monotonic()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    print(f"    done by task: {after}", flush=True)
    return (sum(after.values()) - before) / (end - at)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limits")
    parser.add_argument("--dsn", default=os.environ.get("ASYNCQ_BENCH_DSN"), required=False)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=200_000)
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn or $ASYNCQ_BENCH_DSN")

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    dsn = with_dbname(args.dsn, DB)
    subprocess.run(
        [sys.executable, "-m", "asyncq", "migrate", "benchmarks.limits_app:app"],
        # With the limits declared, so that the index of the limited claim is made.
        env=dict(os.environ, ASYNCQ_DSN=dsn, BENCH_LIMITS="1"),
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    rates: dict[bool, list[float]] = {False: [], True: []}
    try:
        for number in range(1, args.rounds + 1):
            # In turns, first one then the other, so that a drift of the machine's load
            # weighs on both alike.
            for limited in (False, True) if number % 2 else (True, False):
                fill(dsn, args.jobs)
                rate = run(
                    dsn,
                    limited=limited,
                    seconds=args.seconds,
                    workers=args.workers,
                    concurrency=args.concurrency,
                )
                rates[limited].append(rate)
                name = "limited" if limited else "plain  "
                print(f"round {number} {name}: {rate:8.0f} jobs/s", flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    plain, limited = statistics.median(rates[False]), statistics.median(rates[True])
    ratios = [b / a for a, b in zip(rates[False], rates[True], strict=True)]
    print(f"median plain:   {plain:8.0f} jobs/s")
    print(f"median limited: {limited:8.0f} jobs/s")
    print(
        f"limited / plain: {limited / plain:.2f} (of the medians);"
        f" {statistics.median(ratios):.2f} (median of the rounds' ratios)"
    )


if __name__ == "__main__":
    main()
