"""What limits a fleet: 1, 2, 4 and 8 worker processes on one PostgreSQL.

``python -m benchmarks.fleet --dsn DSN [--workers 1,2,4,8] [--jobs 100000] [--ms 10]
[--concurrency 25] [--rounds 1]``

For each number of workers: a fresh table, the workers started and ready, then
``--jobs`` jobs of ``--ms`` milliseconds (`benchmarks.fleet_app`) written by one
INSERT; the drain is timed from that commit to the last ``finished_at``, by the
server's clock. Meanwhile ``pg_stat_activity`` is sampled every 0.2 s: each worker's
connections, and what the backends running a statement wait on (``CPU`` when nothing:
``LWLock:WALWrite`` and ``IO:WalSync`` are commits waiting for the WAL flush,
``Lock:*`` a claim waiting for another's row lock). Also: WAL bytes per job
(``pg_current_wal_lsn``; ``pg_stat_wal``'s records and full-page images: each run
follows a ``TRUNCATE`` and a ``CHECKPOINT``, so its pages are new, and whole pages are
written again only when another checkpoint comes during the drain), commits per job and
per WAL flush (``pg_stat_io`` on PostgreSQL 18, ``pg_stat_wal.wal_sync`` before), and
the CPU seconds of the workers, of the server's processes and of the whole machine.
The workers run on this machine, without namespaces (the fault test
`tests/faults/test_fleet.py` runs them as hosts).

Nothing here asserts a speed. The role must be a superuser (the database
``asyncq_bench_fleet`` is dropped and created).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.common import ROOT, with_dbname

DB = "asyncq_bench_fleet"
APP = "benchmarks.fleet_app:app"

ACTIVITY = """
SELECT application_name, state, wait_event_type, wait_event, query
  FROM pg_stat_activity
 WHERE datname = %s AND backend_type = 'client backend' AND application_name LIKE 'asyncq:%%'
"""


class Activity(threading.Thread):
    def __init__(self, dsn: str) -> None:
        super().__init__(name="activity")
        self.dsn = dsn
        self.stop = threading.Event()
        self.per_worker: dict[str, list[int]] = defaultdict(list)
        self.waits: Counter[str] = Counter()
        self.active: list[int] = []

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.2):
                rows = conn.execute(ACTIVITY, (DB,)).fetchall()
                per: Counter[str] = Counter()
                active = 0
                for name, state, wait_type, wait_event, query in rows:
                    per[name.split(":")[1]] += 1
                    if state == "active" and not query.lstrip().upper().startswith("LISTEN"):
                        active += 1
                        self.waits[f"{wait_type}:{wait_event}" if wait_type else "CPU"] += 1
                for pid, n in per.items():
                    self.per_worker[pid].append(n)
                self.active.append(active)

    def figures(self) -> dict[str, Any]:
        seen = sum(self.waits.values()) or 1
        return {
            "connections_per_worker_median": statistics.median(
                statistics.median(v) for v in self.per_worker.values()
            ),
            "connections_per_worker_max": max(max(v) for v in self.per_worker.values()),
            "active_backends_mean": round(statistics.mean(self.active or [0]), 2),
            "waiting_on_pct": {k: round(100 * n / seen, 1) for k, n in self.waits.most_common(6)},
        }


def counters(conn: psycopg.Connection[Any]) -> dict[str, float]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    version = int(conn.info.server_version)
    if version >= 180000:
        query = "SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'"
    else:
        query = "SELECT wal_sync FROM pg_stat_wal"
    fsyncs = conn.execute(query).fetchone()
    commits = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DB,)
    ).fetchone()
    wal = conn.execute("SELECT wal_records, wal_fpi FROM pg_stat_wal").fetchone()
    assert lsn and fsyncs and commits and wal
    return {
        "wal": float(lsn[0]),
        "fsyncs": float(fsyncs[0]),
        "commits": float(commits[0]),
        "records": float(wal[0]),
        "fpi": float(wal[1]),
    }


def cpu(pids: list[int] | None = None) -> float:
    """CPU seconds of these processes; without pids, of every ``postgres`` process and
    of the postmasters' reaped children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in pids or [int(e) for e in os.listdir("/proc") if e.isdigit()]:
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if pids is None and comm != "postgres":
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
        if pids is None and int(fields[1]) == 1:  # a postmaster
            total += (int(fields[13]) + int(fields[14])) / tick
    return total


def machine() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def drain(dsn: str, workers: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE asyncq_jobs")
        conn.execute("VACUUM ANALYZE asyncq_jobs")
        conn.execute("CHECKPOINT")
        env = dict(os.environ, ASYNCQ_DSN=dsn)
        command = [sys.executable, "-m", "asyncq", "worker", APP]
        command += ["--concurrency", str(args.concurrency)]
        command += ["--batch-size", str(max(1, args.concurrency // 2))]
        procs = []
        for i in range(workers):
            with (logs / f"worker-{workers}-{i}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        command, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=log
                    )
                )
        try:
            for i in range(workers):
                path = logs / f"worker-{workers}-{i}.log"
                deadline = time.monotonic() + 60
                while " started: " not in path.read_text():
                    assert procs[i].poll() is None and time.monotonic() < deadline, path.read_text()
                    time.sleep(0.05)
            activity = Activity(dsn)
            activity.start()
            before = counters(conn)
            cpu_before = (cpu(), cpu([p.pid for p in procs]), *machine())
            row = conn.execute(
                "WITH i AS (INSERT INTO asyncq_jobs (task_name, args)"
                "  SELECT 'sleep_ms', jsonb_build_object('ms', %s::int)"
                "    FROM generate_series(1, %s) RETURNING 1)"
                " SELECT count(*), clock_timestamp() FROM i",
                (args.ms, args.jobs),
            ).fetchone()
            assert row is not None
            inserted_at = row[1]
            after_insert = counters(conn)
            while conn.execute(
                "SELECT count(*) FROM asyncq_jobs WHERE status IN ('queued', 'running')"
            ).fetchone() != (0,):
                time.sleep(0.25)
            end = conn.execute("SELECT max(finished_at) FROM asyncq_jobs").fetchone()
            assert end is not None
            after = counters(conn)
            cpu_after = (cpu(), cpu([p.pid for p in procs]), *machine())
            activity.stop.set()
            activity.join()
            done = conn.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'").fetchone()
            assert done is not None
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(30)
    seconds = (end[0] - inserted_at).total_seconds()
    commits = after["commits"] - after_insert["commits"]
    fsyncs = after["fsyncs"] - after_insert["fsyncs"]
    return {
        "workers": workers,
        "jobs_done": done[0],
        "drain_s": round(seconds, 2),
        "jobs_per_s": round(args.jobs / seconds),
        "slots_bound_jobs_per_s": round(workers * args.concurrency * 1000 / args.ms)
        if args.ms
        else None,
        "insert_wal_bytes_per_job": round((after_insert["wal"] - before["wal"]) / args.jobs),
        "wal_bytes_per_job": round((after["wal"] - after_insert["wal"]) / args.jobs),
        "wal_records_per_job": round((after["records"] - after_insert["records"]) / args.jobs, 2),
        "full_page_images_per_job": round((after["fpi"] - after_insert["fpi"]) / args.jobs, 3),
        "commits_per_job": round(commits / args.jobs, 3),
        "commits_per_wal_flush": round(commits / fsyncs, 2) if fsyncs else None,
        "wal_flushes_per_s": round(fsyncs / seconds),
        "server_cpu_s": round(cpu_after[0] - cpu_before[0], 1),
        "workers_cpu_s": round(cpu_after[1] - cpu_before[1], 1),
        "machine_busy_pct": round(
            100 * (cpu_after[2] - cpu_before[2]) / (cpu_after[3] - cpu_before[3]), 1
        ),
        **activity.figures(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet")
    parser.add_argument("--dsn", default=os.environ.get("ASYNCQ_BENCH_DSN"))
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--ms", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn or $ASYNCQ_BENCH_DSN")
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
        version = admin.info.server_version
    dsn = with_dbname(args.dsn, DB)
    subprocess.run(
        [sys.executable, "-m", "asyncq", "migrate", APP],
        env=dict(os.environ, ASYNCQ_DSN=dsn),
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-") as folder:
            for number in range(1, args.rounds + 1):
                for workers in [int(n) for n in args.workers.split(",")]:
                    found = drain(dsn, workers, args, Path(folder))
                    found["round"] = number
                    results.append(found)
                    print(json.dumps(found), flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "server_version": version,
        "jobs": args.jobs,
        "ms": args.ms,
        "concurrency": args.concurrency,
        "results": results,
    }
    (args.out / "fleet.json").write_text(json.dumps(document, indent=2) + "\n")
    print(f"{'workers':>7} {'jobs/s':>8} {'WAL B/job':>9} {'commits/flush':>13} {'busy %':>6}")
    for r in results:
        print(
            f"{r['workers']:>7} {r['jobs_per_s']:>8} {r['wal_bytes_per_job']:>9}"
            f" {r['commits_per_wal_flush']!s:>13} {r['machine_busy_pct']:>6}"
        )


if __name__ == "__main__":
    main()
