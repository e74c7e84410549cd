"""Where a drain's time goes: the worker's CPU, the rest of the machine's, WAL and commits.

``python -m benchmarks.split --dsn DSN [--jobs 60000] [--rounds 3] [--asyncq 100,100]
[--baseline REF]``

For asyncq at c=100 b=100 (``--asyncq C,B`` for another), asyncq as it was at the commit
REF at the same point (with ``--baseline``), and plain SQL at its best (10 coroutines,
batches of 100, batched), in turns: pre-load the jobs, start one worker
process and time its drain as benchmarks/measure.py does, reading around the drain

- the worker process's CPU time (``/proc/<pid>/stat``: user and system);
- the whole machine's busy CPU time (``/proc/stat``), less the worker's: the server's
  backends, the harness's probe, everything else;
- the server's WAL records, bytes, writes and syncs (``pg_stat_wal``) and its commits
  (``pg_stat_database.xact_commit``, every database: the probe's included).

- from 0.3 s into the drain to its end, the time the worker process and the server
  processes of its database (its claims', its other connections' and the harness's
  probe's) spent on a CPU and runnable but waiting for one (``/proc/<pid>/schedstat``),
  as shares of that time (the server processes' summed).

Per job, and as a share of a core over the drain. The server must be the harness's own
(this machine): its CPU is read from the same ``/proc``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import baseline, measure
from benchmarks.common import ROOT, connect, drop_database, recreate_database, run_async, workers
from benchmarks.systems import Point, System, load

TICK = os.sysconf("SC_CLK_TCK")
SQL_BEST = Point(10, 100, variant="batched")
WAL = "SELECT wal_records, wal_bytes, wal_write, wal_sync FROM pg_stat_wal"
COMMITS = "SELECT sum(xact_commit) FROM pg_stat_database"
WARM_UP = 0.3  # seconds into a drain before its scheduling is read
LOGS = ROOT / "benchmarks" / "results" / "logs"  # each worker's stderr


def machine_busy() -> float:
    """Seconds of CPU the whole machine has been busy (all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def scheduled(pid: int) -> tuple[float, float] | None:
    """Seconds ``pid`` has run on a CPU, and seconds it has waited, runnable, for one
    (``/proc/<pid>/schedstat``); None once it is gone."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except OSError:
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


async def backends(dsn: str) -> list[int]:
    """The server processes of the other sessions on ``dsn``'s database."""
    async with await connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [int(row[0]) for row in await cur.fetchall()]


class Scheduling:
    """The scheduling of processes, read every few milliseconds until ``stop``: a
    process that exits (the worker's server processes go with it at the drain's end)
    is counted up to its last reading."""

    def __init__(self, pids: list[int]) -> None:
        began = time.perf_counter()
        self.first = {pid: (began, scheduled(pid)) for pid in pids}
        self.last = dict(self.first)
        self._stopped = asyncio.Event()

    async def run(self) -> None:
        while not self._stopped.is_set():
            now = time.perf_counter()
            for pid in self.first:
                reading = scheduled(pid)
                if reading is not None:
                    self.last[pid] = (now, reading)
            await asyncio.sleep(0.005)

    def stop(self) -> list[float]:
        """The worker's (the first pid) and the others' summed shares of time on a CPU
        and waiting for one."""
        self._stopped.set()
        shares = [0.0, 0.0, 0.0, 0.0]
        for i, (pid, (began, then)) in enumerate(self.first.items()):
            ended, now = self.last[pid]
            if then is None or now is None or ended <= began:
                continue
            at = 0 if i == 0 else 2
            shares[at] += (now[0] - then[0]) / (ended - began)
            shares[at + 1] += (now[1] - then[1]) / (ended - began)
        return shares


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def server_counters(dsn: str) -> tuple[float, ...]:
    async with await connect(dsn) as conn:
        wal = await (await conn.execute(WAL)).fetchone()
        commits = await (await conn.execute(COMMITS)).fetchone()
    assert wal is not None and commits is not None
    return (*map(float, wal), float(commits[0]))


async def drain(system: System, point: Point, jobs: int, admin: str) -> dict[str, float]:
    await system.reset()
    await measure.preload(system, jobs)
    await measure.settle(system)
    args = measure.worker_args(system, point, "drain")
    async with workers(args, 1, LOGS, measure.tag_of(system, point)) as [worker]:
        pid = worker.proc.pid
        await system.unfinished()  # the probe's connection, opened before the clock starts
        before = await server_counters(admin)
        worker0, busy0 = process_cpu(pid), machine_busy()
        started = time.perf_counter()
        worker.go()
        # The worker opens its connections once told to go: its server processes are
        # looked up once it is under way, and their scheduling read from then to the end.
        await asyncio.sleep(WARM_UP)
        watch = Scheduling([pid, *await backends(system.dsn)])
        watching = asyncio.create_task(watch.run())
        await measure.wait_until_done(
            system, interval=measure.POLL_INTERVAL, within=120 + jobs / 100
        )
        seconds = time.perf_counter() - started
        worker_cpu, busy = process_cpu(pid) - worker0, machine_busy() - busy0
        shares = watch.stop()
        await watching
        await worker.wait_exit(30)
    await system.close_probe()
    await asyncio.sleep(0.6)  # the statistics collector's flush (500 ms)
    after = await server_counters(admin)
    records, wal_bytes, writes, syncs, commits = (a - b for a, b in zip(after, before, strict=True))
    per_job = 1e6 / jobs
    return {
        "rate": jobs / seconds,
        "worker_us": worker_cpu * per_job,
        "worker_cores": worker_cpu / seconds,
        "rest_us": (busy - worker_cpu) * per_job,
        "rest_cores": (busy - worker_cpu) / seconds,
        "wal_records": records / jobs,
        "wal_bytes": wal_bytes / jobs,
        "wal_syncs_per_1000": syncs * 1000 / jobs,
        "wal_writes_per_1000": writes * 1000 / jobs,
        "commits_per_1000": commits * 1000 / jobs,
        "worker_on_cpu": shares[0],
        "worker_waiting": shares[1],
        "server_on_cpu": shares[2],
        "server_waiting": shares[3],
    }


async def main(args: argparse.Namespace) -> None:
    concurrency, batch = (int(n) for n in args.asyncq.split(","))
    cases = [("asyncq", Point(concurrency, batch)), ("sql", SQL_BEST)]
    with tempfile.TemporaryDirectory(prefix="asyncq-baseline-") as scratch:
        if args.baseline:
            package = baseline.extract(baseline.resolve(args.baseline), Path(scratch))
            sys.path.append(str(package.parent))
            cases.insert(1, ("baseline", Point(concurrency, batch)))
        await measure_cases(args, cases)


async def measure_cases(args: argparse.Namespace, cases: list[tuple[str, Point]]) -> None:
    systems: list[tuple[str, System, Point]] = []
    for name, point in cases:
        system = load(name).SYSTEM(await recreate_database(args.dsn, name))
        await system.install()
        await system.open()
        systems.append((name, system, point))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in systems}
    try:
        for turn in range(args.rounds):
            for name, system, point in systems if turn % 2 == 0 else systems[::-1]:
                run = await drain(system, point, args.jobs, args.dsn)
                runs[name].append(run)
                print(f"  {name:8} {point.label:20} {_line(run)}", flush=True)
    finally:
        for name, system, _ in systems:
            await system.close()
            await drop_database(args.dsn, name)
    print(f"\nmedians of {args.rounds} drains of {args.jobs:,} jobs:")
    for name, point in cases:
        median = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        print(f"  {name:8} {point.label:20} {_line(median)}")
    for name, _ in cases[1:]:
        ratios = [a["rate"] / b["rate"] for a, b in zip(runs["asyncq"], runs[name], strict=True)]
        listed = " ".join(f"{r:.2f}" for r in ratios)
        print(f"asyncq / {name}: {statistics.median(ratios):.2f}x (rounds {listed})")


def _line(run: dict[str, Any]) -> str:
    return (
        f"{run['rate']:>8,.0f} jobs/s; worker {run['worker_us']:.1f} µs/job"
        f" ({run['worker_cores']:.2f} of a core), the rest {run['rest_us']:.1f} µs/job"
        f" ({run['rest_cores']:.2f}); per job {run['wal_records']:.1f} WAL records,"
        f" {run['wal_bytes']:,.0f} bytes; per 1,000 jobs {run['commits_per_1000']:.1f}"
        f" commits, {run['wal_syncs_per_1000']:.1f} WAL syncs; on a CPU / runnable, waiting"
        f" for one: the worker {run['worker_on_cpu']:.2f} / {run['worker_waiting']:.2f},"
        f" its server processes {run['server_on_cpu']:.2f} / {run['server_waiting']:.2f}"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.split", description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("ASYNCQ_BENCH_DSN"), required=False)
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--asyncq", default="100,100", help="asyncq's concurrency,batch size")
    parser.add_argument("--baseline", help="also asyncq as it was at this commit, in turns")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or $ASYNCQ_BENCH_DSN): a superuser on this machine's server")
    run_async(lambda: main(args))


if __name__ == "__main__":
    cli()
