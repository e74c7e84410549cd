"""Schedules at scale: ``python -m benchmarks.schedules --dsn DSN``.

500 schedules (``--schedules``), every minute, in worker processes (``--workers``, 2)
of `benchmarks.schedule_app` for ``--seconds`` (150: two or three minute boundaries).
The schedules' rows are written first with their last slot an hour ago, so the first
slot fires as the workers start (as after downtime); then every minute boundary is a
slot for all of them. It reports, per slot, the jobs fired (all of them, none twice)
and how long after the slot they were written (``created_at - scheduled_at``); per
worker process, its CPU time (user + system, from /proc) and how many jobs it fired; and
the cost of one in-memory check of all the schedules, the scheduler's work in a second
when nothing is due. The jobs are no-ops, so a worker's CPU time is the scheduler's
and the claim-and-run of its share of the jobs.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg

from benchmarks.common import drop_database, recreate_database, run_async

ROOT = Path(__file__).resolve().parents[1]
APP = "benchmarks.schedule_app:app"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check_cost(schedules: int) -> float:
    """Microseconds for one in-memory check of ``schedules`` schedules, none due."""
    from datetime import UTC, datetime

    from asyncq.schedule import Cron, Schedule
    from asyncq.worker.maintenance.scheduler import DatabaseClock, Scheduler
    from asyncq.worker.observer import Observer

    cron = Cron("* * * * *")
    declared = [
        Schedule(
            name=f"s{n}",
            cron=cron,
            task_name="t",
            queue="q",
            args="{}",
            priority=0,
            max_attempts=1,
        )
        for n in range(schedules)
    ]
    scheduler = Scheduler(
        pool=None,  # type: ignore[arg-type]  # never used: nothing is due
        store=None,  # type: ignore[arg-type]
        schema="public",
        schedules=declared,
        observer=Observer(),
        clock=DatabaseClock(),
    )
    now = datetime.now(UTC)
    scheduler.upcoming = {s.name: cron.next_after(now) for s in declared}
    rounds = 2000
    started = time.perf_counter()
    for _ in range(rounds):
        assert not scheduler.due(now)
    return (time.perf_counter() - started) / rounds * 1e6


def drive(dsn: str, args: argparse.Namespace) -> int:
    env = {**os.environ, "ASYNCQ_DSN": dsn, "BENCH_SCHEDULES": str(args.schedules)}
    migrate = subprocess.run(
        [sys.executable, "-m", "asyncq", "migrate", APP], env=env, cwd=ROOT, check=False
    )
    if migrate.returncode:
        return 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO asyncq_schedules (name, task_name, cron, tz, last_slot)"
            " SELECT format('bench-%%s', lpad(n::text, 4, '0')), 'bench.tick', '* * * * *',"
            "        'UTC', date_trunc('minute', now()) - interval '1 hour'"
            "   FROM generate_series(0, %s - 1) AS n",
            (args.schedules,),
        )
    logs = [Path(f"/tmp/asyncq-bench-schedules-{n}.log") for n in range(args.workers)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "asyncq", "worker", APP, "--concurrency", "50"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
        )
        for log in logs
    ]
    started = time.monotonic()
    time.sleep(args.seconds)
    cpu = [cpu_seconds(w.pid) for w in workers]
    elapsed = time.monotonic() - started
    for w in workers:
        w.send_signal(signal.SIGTERM)
    exits = [w.wait(60) for w in workers]

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT scheduled_at, count(*), count(DISTINCT schedule),"
            "       count(*) FILTER (WHERE status = 'done'),"
            "       percentile_cont(0.5) WITHIN GROUP"
            "         (ORDER BY extract(epoch FROM created_at - scheduled_at)),"
            "       max(extract(epoch FROM created_at - scheduled_at))"
            "  FROM asyncq_jobs GROUP BY scheduled_at ORDER BY scheduled_at"
        )
        slots = cur.fetchall()
        cur = conn.execute(
            "SELECT count(*) FROM (SELECT schedule, scheduled_at FROM asyncq_jobs"
            " GROUP BY 1, 2 HAVING count(*) > 1) AS twice"
        )
        row = cur.fetchone()
        twice = row[0] if row else -1
    fired = [
        Counter(re.findall(r"schedule \S+: slot (\S+) made job", log.read_text())) for log in logs
    ]

    print(f"{args.schedules} schedules every minute, {args.workers} workers, {elapsed:.0f} s")
    print(f"{'slot':<27} {'jobs':>5} {'schedules':>9} {'done':>5} {'median s':>9} {'max s':>7}")
    for slot, jobs, distinct, done, median, worst in slots:
        print(
            f"{slot.isoformat():<27} {jobs:>5} {distinct:>9} {done:>5} {median:>9.3f} {worst:>7.3f}"
        )
    print(f"(schedule, slot) pairs with more than one job: {twice}")
    for n, (seconds, counts) in enumerate(zip(cpu, fired, strict=True)):
        print(
            f"worker {n}: CPU {seconds:.2f} s in {elapsed:.0f} s"
            f" ({seconds / elapsed * 60:.2f} s per minute); fired {sum(counts.values())} jobs"
            f" over {len(counts)} slots"
        )
    print(f"exit codes: {exits}")
    print(
        f"one in-memory check of {args.schedules} schedules, none due:"
        f" {check_cost(args.schedules):.0f} us"
    )
    all_fired = all(jobs == args.schedules == distinct for _, jobs, distinct, *_ in slots)
    return 0 if all_fired and twice == 0 and exits == [0] * args.workers else 1


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.schedules")
    parser.add_argument("--dsn", required=True, help="a superuser DSN (a database is made)")
    parser.add_argument("--schedules", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=150.0)
    args = parser.parse_args()

    dsn = run_async(lambda: recreate_database(args.dsn, "schedules"))
    try:
        code = drive(dsn, args)
    finally:
        run_async(lambda: drop_database(args.dsn, "schedules"))
    sys.exit(code)


if __name__ == "__main__":
    main()
