"""Fair groups: what a claim costs with one group against 10,000, and the share of the
work each of three tenants gets.

``python -m benchmarks.fair_groups --dsn DSN [--part claims|shares|all] [--rounds 2]
[--jobs 20000] [--claims 60] [--seconds 30] [--plot PNG]``

DSN is a database of its own: each round empties its jobs table.

Claims: each round defers ``--jobs`` jobs of one task in one group, or spread over
10,000 groups, and times ``--claims`` limited claims of 10 on one connection, as a
worker makes them (the task named among the limited ones, as the limiter names a task
deferred in groups). It prints the median of each round, the first 10 claims left out.
The schema is migrated with a limited task, so that ``asyncq_jobs_ready_by_task`` exists.

Shares: one worker process (`benchmarks.fair_app`, concurrency 10, jobs of 100 ms: at
most 100 jobs a second) and three tenants deferring 25, 5 and 1 jobs every 100 ms (250,
50 and 10 a second: three times what the worker can run) for ``--seconds``, then
``--seconds / 3`` more without deferring; once with each tenant's jobs in its own
group, once without groups (one queue in order of arrival). Each tenant's jobs done a
second and the median wait of the jobs it started (from due to start), in windows of a
tenth of the run, are read from the jobs' own times; the medians over the rounds are
printed, and drawn to ``--plot``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg

import asyncq
from asyncq.limits import ClaimLimits, TaskLimits
from benchmarks.fair_app import TASK as TENANT_TASK

TASK = "bench.fair"
ROOT = Path(__file__).resolve().parent.parent
TENANTS = {"big": 25, "mid": 5, "small": 1}  # jobs deferred every TICK
TICK = 0.1
JOB_MS = 100
CONCURRENCY = 10
WINDOWS = 10


async def claim_times(dsn: str, groups: int, jobs: int, claims: int) -> float:
    """The median milliseconds of a claim of 10 behind ``jobs`` jobs in ``groups`` groups."""
    async with asyncq.App(dsn) as app:

        @app.task(name=TASK)
        async def fair(n: int) -> None: ...

        @app.task(name="bench.capped", concurrency=1)
        async def capped() -> None: ...

        await app.migrate()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE asyncq_jobs, asyncq_fair_tasks, asyncq_group_turns")
            for g in range(groups):
                await fair.options(group=f"g{g}").defer_many(
                    [{"n": i} for i in range(jobs // groups)]
                )
            await conn.execute("VACUUM ANALYZE asyncq_jobs")
            limits = ClaimLimits.of([(TASK, TaskLimits())], fair=[TASK])
            assert limits is not None
            took = []
            for _ in range(claims):
                began = time.perf_counter()
                claimed = await app.store.claim_limited(
                    conn,
                    worker="bench",
                    limit=10,
                    queues=None,
                    lease=timedelta(seconds=300),
                    limits=limits,
                    limited=10,
                )
                took.append(time.perf_counter() - began)
                assert len(claimed) == 10
    return statistics.median(took[10:]) * 1000


async def offer(app: asyncq.App, seconds: float, grouped: bool) -> None:
    """Each tenant defers its jobs every `TICK` for ``seconds``, in its own group or not."""

    @app.task(name=TENANT_TASK)
    async def tenant_job(tenant: str, ms: int) -> None: ...

    start = time.monotonic()
    ticks = 0
    while (at := start + ticks * TICK) < start + seconds:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        for tenant, count in TENANTS.items():
            deferrer = tenant_job.options(group=tenant) if grouped else tenant_job
            await deferrer.defer_many([{"tenant": tenant, "ms": JOB_MS}] * count)
        ticks += 1


async def shares(dsn: str, seconds: float, grouped: bool) -> dict[str, list[tuple[float, float]]]:
    """One run: for each tenant and each of `WINDOWS` windows of the run, its jobs done a
    second and the median seconds from due to start of the jobs it started."""
    async with (
        asyncq.App(dsn) as app,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        await app.migrate()
        await conn.execute(
            "TRUNCATE asyncq_jobs, asyncq_fair_tasks, asyncq_group_turns, asyncq_workers"
        )
        worker = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "asyncq", "worker", "benchmarks.fair_app:app"),
            *("--concurrency", str(CONCURRENCY)),
            env=dict(os.environ, ASYNCQ_DSN=dsn),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(600):  # until the worker has started
                if await (await conn.execute("SELECT 1 FROM asyncq_workers")).fetchone():
                    break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError("the worker did not start within 30 s")
            began = await (await conn.execute("SELECT now()")).fetchone()
            await offer(app, seconds, grouped)
            await asyncio.sleep(seconds / 3)
        finally:
            worker.send_signal(signal.SIGTERM)
            await worker.wait()
        assert began is not None
        span = seconds * 4 / 3 / WINDOWS
        rows = await (
            await conn.execute(
                "SELECT args->>'tenant', w,"
                "  count(*) FILTER (WHERE status = 'done' AND finished_at >= start"
                "    AND finished_at < start + make_interval(secs => %(span)s)),"
                "  percentile_cont(0.5) WITHIN GROUP (ORDER BY"
                "    extract(epoch FROM started_at - run_at))"
                "    FILTER (WHERE started_at >= start"
                "      AND started_at < start + make_interval(secs => %(span)s))"
                " FROM asyncq_jobs,"
                "  LATERAL (SELECT w, %(began)s + make_interval(secs => w * %(span)s) AS start"
                "    FROM generate_series(0, %(windows)s - 1) AS w) AS windows"
                " GROUP BY 1, 2 ORDER BY 1, 2",
                {"span": span, "began": began[0], "windows": WINDOWS},
            )
        ).fetchall()
    found: dict[str, list[tuple[float, float]]] = {t: [] for t in TENANTS}
    for tenant, _, done, wait in rows:
        found[tenant].append((done / span, float("nan") if wait is None else wait))
    return found


def print_shares(mode: str, runs: list[dict[str, list[tuple[float, float]]]], span: float) -> None:
    print(f"{mode}: jobs done a second (share), median wait of the jobs started; medians")
    for w in range(WINDOWS):
        cells = []
        rates = {t: statistics.median(r[t][w][0] for r in runs) for t in TENANTS}
        total = sum(rates.values()) or 1.0
        for tenant in TENANTS:
            wait = statistics.median(r[tenant][w][1] for r in runs)
            cells.append(
                f"{tenant} {rates[tenant]:5.1f}/s ({rates[tenant] / total:4.0%}) {wait:6.2f} s"
            )
        print(f"  {w * span:5.1f}-{(w + 1) * span:5.1f} s  " + "  ".join(cells), flush=True)


def plot(
    path: str, found: dict[str, list[dict[str, list[tuple[float, float]]]]], span: float
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 6), sharex=True)
    at = [(w + 0.5) * span for w in range(WINDOWS)]
    for col, (mode, runs) in enumerate(found.items()):
        for tenant in TENANTS:
            rates = [statistics.median(r[tenant][w][0] for r in runs) for w in range(WINDOWS)]
            waits = [statistics.median(r[tenant][w][1] for r in runs) for w in range(WINDOWS)]
            label = f"{tenant} ({TENANTS[tenant] / TICK:.0f}/s offered)"
            axes[0][col].plot(at, rates, marker="o", label=label)
            axes[1][col].plot(at, waits, marker="o", label=label)
        axes[0][col].set_title(mode)
        axes[0][col].set_ylabel("jobs done a second")
        axes[1][col].set_ylabel("median wait, s")
        axes[1][col].set_xlabel("seconds into the run (offers stop at 3/4)")
        axes[0][col].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fair_groups")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--part", choices=("claims", "shares", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--claims", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--plot", help="draw the shares to this PNG")
    args = parser.parse_args()
    if args.part in ("claims", "all"):
        for _ in range(args.rounds):
            for groups in (1, 10_000):
                ms = await claim_times(args.dsn, groups, args.jobs, args.claims)
                print(f"{groups:>6} groups, {args.jobs} jobs: claim of 10, median {ms:.2f} ms")
    if args.part in ("shares", "all"):
        span = args.seconds * 4 / 3 / WINDOWS
        found: dict[str, list[dict[str, list[tuple[float, float]]]]] = {
            "fair groups": [],
            "no groups (in order of arrival)": [],
        }
        for _ in range(args.rounds):
            for mode, runs in found.items():  # in turns: a drift of the load hits both
                runs.append(await shares(args.dsn, args.seconds, mode == "fair groups"))
        for mode, runs in found.items():
            print_shares(mode, runs, span)
        if args.plot:
            plot(args.plot, found, span)


if __name__ == "__main__":
    asyncio.run(main())
