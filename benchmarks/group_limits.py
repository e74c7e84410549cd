"""Per-group limits under a backlog, and a new group's first job behind another's backlog.

``python -m benchmarks.group_limits --dsn DSN [--rounds 3] [--plot benchmarks/group_limits.png]``

On a database of its own (``asyncq_bench_group_limits``, made and dropped here), each
round has three parts, each with ``--workers`` worker processes of
`benchmarks.group_limits_app` at ``--concurrency`` slots each, on a table emptied first:

- ``limits``: ``--jobs`` jobs of ``--ms`` milliseconds in each of the groups A, B and C,
  whose tasks have ``group_concurrency`` 25, 5 and 1. Every 100 ms another connection
  counts each group's running jobs (``status = 'running'``), for ``--seconds``.
- ``kill``: the same with jobs of ``--kill-ms`` milliseconds, and one worker is killed
  with SIGKILL at the first sample ``--kill-after`` seconds in at which it holds jobs.
  Its jobs stay running until their lease (``--lease``) expires and a rescuer puts them
  back; from then on the survivor alone should hold each group at its limit (no slot
  leaked). The samples count the dead worker's jobs apart (``locked_by``).
- ``first``: ``--backlog`` jobs of one group of the unlimited task; once the workers are
  under way, ``--firsts`` times a job of a new group, each timed from its insert to its
  start (``started_at - created_at``, the server's clock), with the backlog's jobs that
  started in between counted.

A group's figures (the max, median and mean of its samples, and how fast its queued jobs
went) count only the samples while it had queued jobs, after a warm-up (its first job
started), and in ``kill`` only those after the dead worker's last job was put back.
Medians over the rounds; the plot is the last round's ``limits`` and ``kill`` samples.
Nothing here asserts a timing.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import asyncq
from benchmarks.common import ROOT, with_dbname
from benchmarks.group_limits_app import LIMITS, TENANT, register

DB = "asyncq_bench_group_limits"
APP = "benchmarks.group_limits_app:app"
INTERVAL = 0.1

SAMPLE = """
SELECT group_key,
       count(*) FILTER (WHERE status = 'running'),
       count(*) FILTER (WHERE status = 'running' AND locked_by = %(dead)s),
       count(*) FILTER (WHERE status = 'queued')
  FROM asyncq_jobs
 WHERE group_key = ANY(%(groups)s)
 GROUP BY group_key
"""


@dataclass
class Sample:
    """One count of the groups' jobs, ``at`` seconds after the workers started."""

    at: float
    running: dict[str, int]
    dead: dict[str, int] = field(default_factory=dict)  # running, held by the killed worker
    queued: dict[str, int] = field(default_factory=dict)

    def live(self, group: str) -> int:
        return self.running.get(group, 0) - self.dead.get(group, 0)


@dataclass
class GroupFigure:
    limit: int
    max: int
    median: float
    mean: float  # the time-weighted concurrency, as the samples are evenly spaced
    samples: int
    started_per_s: float  # how fast its queued jobs went, over the samples counted


def figures(
    samples: Sequence[Sample], limits: dict[str, int], *, since: float = 0.0
) -> dict[str, GroupFigure]:
    """Per group, the max and median of its live running jobs over the samples taken at or
    after ``since``, once its first job ran and while it had queued jobs."""
    out = {}
    for group, limit in limits.items():
        counted: list[Sample] = []
        started = False
        for s in samples:
            started = started or s.running.get(group, 0) > 0
            if s.at >= since and started and s.queued.get(group, 0) > 0:
                counted.append(s)
        live = [s.live(group) for s in counted]
        span = counted[-1].at - counted[0].at if counted else 0.0
        went = counted[0].queued[group] - counted[-1].queued[group] if counted else 0
        out[group] = GroupFigure(
            limit=limit,
            max=max(live, default=0),
            median=statistics.median(live) if live else 0.0,
            mean=statistics.fmean(live) if live else 0.0,
            samples=len(live),
            started_per_s=went / span if span > 0 else 0.0,
        )
    return out


def reaped_at(samples: Sequence[Sample], killed_at: float) -> float | None:
    """When the killed worker held no job any more: the first sample after the last one
    with some of its jobs running (the kill's, when it held none; None while it still
    held some at the end)."""
    after = [s for s in samples if s.at >= killed_at]
    held = [n for n, s in enumerate(after) if any(s.dead.values())]
    if not held:
        return after[0].at if after else None
    return after[held[-1] + 1].at if held[-1] + 1 < len(after) else None


def over_rounds(rounds: Sequence[dict[str, GroupFigure]]) -> dict[str, GroupFigure]:
    """Per group: the highest max of the rounds, the median of their medians (and of
    their means and rates)."""
    out = {}
    for group in rounds[0]:
        each = [r[group] for r in rounds]
        out[group] = GroupFigure(
            limit=each[0].limit,
            max=max(f.max for f in each),
            median=statistics.median(f.median for f in each),
            mean=statistics.median(f.mean for f in each),
            samples=sum(f.samples for f in each),
            started_per_s=statistics.median(f.started_per_s for f in each),
        )
    return out


# -- the database and the workers -------------------------------------------------------


async def defer(dsn: str, group: str, task: str, count: int, ms: int) -> list[int]:
    async with asyncq.App(dsn) as app:
        tasks = register(app)
        return await tasks[task].options(group=group).defer_many([{"ms": ms}] * count)


def empty(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE asyncq_jobs, asyncq_fair_tasks, asyncq_group_turns CASCADE")


def analyze(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE asyncq_jobs")


def start_workers(dsn: str, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "asyncq", "worker", APP]
    command += ["--concurrency", str(args.concurrency), "--lease", str(args.lease)]
    command += ["--poll-interval", str(args.poll_interval)]
    return [
        subprocess.Popen(
            command,
            env=dict(os.environ, ASYNCQ_DSN=dsn),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(args.workers)
    ]


def stop_workers(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(60)


def worker_id(conn: psycopg.Connection[Any], pid: int) -> str | None:
    """The id of the worker process ``pid`` (its jobs' ``locked_by``), once it has started."""
    row = conn.execute("SELECT id FROM asyncq_workers WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else str(row[0])


def sample_groups(
    dsn: str, procs: Sequence[subprocess.Popen[bytes]], seconds: float, kill_after: float | None
) -> tuple[list[Sample], float | None]:
    """Samples every INTERVAL for ``seconds``; with ``kill_after``, the first worker is
    killed (SIGKILL) at the first sample that long in at which it holds running jobs of
    the groups. Returns the samples and when the kill was."""
    samples: list[Sample] = []
    first, killed_at = "", None
    groups = list(LIMITS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.monotonic()
        tick = began
        while (at := time.monotonic() - began) < seconds:
            if kill_after is not None and not first:
                first = worker_id(conn, procs[0].pid) or ""
            rows = conn.execute(SAMPLE, {"dead": first, "groups": groups}).fetchall()
            held = {g: d for g, _, d, _ in rows}
            if kill_after is not None and killed_at is None:
                if at >= kill_after and any(held.values()):
                    procs[0].kill()
                    killed_at = at
                else:
                    held = {}  # alive: its jobs are live ones
            samples.append(
                Sample(
                    at=at,
                    running={g: r for g, r, _, _ in rows},
                    dead=held,
                    queued={g: q for g, _, _, q in rows},
                )
            )
            tick += INTERVAL
            time.sleep(max(0.0, tick - time.monotonic()))
    return samples, killed_at


def limits_run(
    dsn: str, args: argparse.Namespace, *, kill: bool
) -> tuple[list[Sample], float | None]:
    empty(dsn)
    for group in LIMITS:
        asyncio.run(defer(dsn, group, group, args.jobs, args.kill_ms if kill else args.ms))
    analyze(dsn)
    procs = start_workers(dsn, args)
    try:
        return sample_groups(dsn, procs, args.seconds, args.kill_after if kill else None)
    finally:
        stop_workers(procs)


@dataclass
class FirstJob:
    waited_ms: float
    ahead: int  # jobs of the backlog that started between its insert and its start


def first_run(dsn: str, args: argparse.Namespace) -> list[FirstJob]:
    empty(dsn)
    asyncio.run(defer(dsn, "backlog", TENANT, args.backlog, args.ms))
    analyze(dsn)
    procs = start_workers(dsn, args)
    out = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:

            def one(sql: str, *params: object) -> Any:
                row = conn.execute(sql, params).fetchone()
                assert row is not None
                return row[0]

            started = "SELECT count(*) FROM asyncq_jobs WHERE group_key = 'backlog'"
            started += " AND started_at IS NOT NULL"
            while one(started) < 20 * args.concurrency * args.workers:
                time.sleep(0.05)
            for n in range(args.firsts):
                before = one(started)
                [job] = asyncio.run(defer(dsn, f"new{n}", TENANT, 1, args.ms))
                while one("SELECT started_at FROM asyncq_jobs WHERE id = %s", job) is None:
                    time.sleep(0.005)
                waited = one(
                    "SELECT extract(epoch FROM started_at - created_at) * 1000"
                    " FROM asyncq_jobs WHERE id = %s",
                    job,
                )
                ahead = one(
                    "SELECT count(*) FROM asyncq_jobs WHERE group_key = 'backlog'"
                    " AND started_at < (SELECT started_at FROM asyncq_jobs WHERE id = %s)",
                    job,
                )
                out.append(FirstJob(waited_ms=float(waited), ahead=int(ahead) - before))
                time.sleep(0.5)
            left = one(
                "SELECT count(*) FROM asyncq_jobs WHERE group_key = 'backlog' AND status = 'queued'"
            )
            assert left > 0, "the backlog ran out before the last new group's job"
    finally:
        stop_workers(procs)
    return out


# -- the report and the plot ------------------------------------------------------------


def describe(name: str, figs: dict[str, GroupFigure], ms: int) -> str:
    return "\n".join(
        f"  {name} group {g} (limit {f.limit:>2}): max {f.max:>2}, median {f.median:g},"
        f" mean {f.mean:.1f}"
        f" ({f.samples} samples); {f.started_per_s:.0f} jobs/s started"
        f" ({f.started_per_s / (f.limit * 1000 / ms):.0%} of limit / job time)"
        for g, f in figs.items()
    )


def plot(
    limits: list[Sample], kill: list[Sample], killed_at: float | None, path: Path, title: str
) -> str | None:
    """Two panels: running jobs per group over time, without and with a worker killed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    colors = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    panels = [
        (axes[0], limits, None, "two workers"),
        (axes[1], kill, killed_at, "one worker killed (SIGKILL)"),
    ]
    for ax, samples, kill_at, name in panels:
        xs = [s.at for s in samples]
        for group, limit in LIMITS.items():
            ax.step(
                xs,
                [s.running.get(group, 0) for s in samples],
                where="post",
                color=colors[group],
                label=f"{group}: running (limit {limit})",
            )
            ax.axhline(limit, color=colors[group], linestyle=":", linewidth=1)
            if kill_at is not None:
                ax.step(
                    xs,
                    [s.live(group) for s in samples],
                    where="post",
                    color=colors[group],
                    linestyle="--",
                    alpha=0.6,
                    label=f"{group}: held by live workers (dashed)",
                )
        if kill_at is not None:
            ax.axvline(kill_at, color="tab:red", linewidth=1, label="SIGKILL")
            reaped = reaped_at(samples, kill_at)
            if reaped is not None:
                ax.axvline(reaped, color="black", linewidth=1, label="its jobs put back")
        ax.set_ylabel("running jobs")
        ax.set_ylim(0, max(LIMITS.values()) + 5)
        ax.set_title(name, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper right")
    axes[1].set_xlabel("seconds since the workers started (sampled every 100 ms)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.group_limits")
    parser.add_argument("--dsn", default=os.environ.get("ASYNCQ_BENCH_DSN"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs in each of A, B, C")
    parser.add_argument("--ms", type=int, default=50, help="each job's sleep")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--kill-after", type=float, default=5.0)
    parser.add_argument("--kill-ms", type=int, default=1000, help="each job's sleep in kill")
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the workers'")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--firsts", type=int, default=5)
    parser.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "group_limits.png")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn or $ASYNCQ_BENCH_DSN")

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    dsn = with_dbname(args.dsn, DB)
    subprocess.run(
        [sys.executable, "-m", "asyncq", "migrate", APP],
        env=dict(os.environ, ASYNCQ_DSN=dsn),
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    plain_rounds, kill_rounds, firsts = [], [], []
    try:
        for number in range(1, args.rounds + 1):
            limits, _ = limits_run(dsn, args, kill=False)
            plain_rounds.append(figures(limits, LIMITS))
            print(
                f"round {number} limits:\n{describe('limits', plain_rounds[-1], args.ms)}",
                flush=True,
            )

            kill, killed_at = limits_run(dsn, args, kill=True)
            reaped = None if killed_at is None else reaped_at(kill, killed_at)
            if killed_at is None:
                print(f"round {number} kill: the first worker held no job to kill", flush=True)
            elif reaped is None:
                print(f"round {number} kill: its jobs were not seen put back", flush=True)
            else:
                kill_rounds.append(figures(kill, LIMITS, since=reaped))
                print(
                    f"round {number} kill: at {killed_at:.1f} s, jobs put back by"
                    f" {reaped:.1f} s (lease {args.lease:g} s); after:\n"
                    f"{describe('kill', kill_rounds[-1], args.kill_ms)}",
                    flush=True,
                )

            each = first_run(dsn, args)
            firsts.extend(each)
            print(
                f"round {number} first job behind {args.backlog:,}: "
                + ", ".join(f"{f.waited_ms:.1f} ms ({f.ahead} ahead)" for f in each),
                flush=True,
            )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")

    print(f"over {args.rounds} rounds (highest max, medians of the rounds' figures):")
    print(describe("limits", over_rounds(plain_rounds), args.ms))
    if kill_rounds:
        print(describe("kill, after the put-back", over_rounds(kill_rounds), args.kill_ms))
    waits = sorted(f.waited_ms for f in firsts)
    print(
        f"  first job of a new group behind {args.backlog:,}: median"
        f" {statistics.median(waits):.1f} ms, max {waits[-1]:.1f} ms ({len(waits)} jobs);"
        f" backlog jobs started in between: median"
        f" {statistics.median(f.ahead for f in firsts):g}, max {max(f.ahead for f in firsts)}"
    )
    title = (
        f"3 groups, limits 25/5/1, {args.workers} workers x c={args.concurrency},"
        f" {args.ms} ms jobs, poll {args.poll_interval:g} s (last round)"
    )
    why = plot(limits, kill, killed_at, args.plot, title)
    print(f"plot: {why or args.plot}")


if __name__ == "__main__":
    main()
