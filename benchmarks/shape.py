"""The seed's shape: short jobs at low concurrency. ``python -m benchmarks.shape``

The seed article (../shared/seeds/, 000) measured a Redis list queue at 1,350 jobs/s with
5 ms of work per job and 8 workers, where the ideal is 8 / 5 ms = 1,600. Here: jobs whose
task is ``asyncio.sleep(0.005)``, pre-loaded, drained by one worker process at each
concurrency (8, 32 and 128), timed from the start signal to the last job done, as the
throughput drains of benchmarks/run.py are (benchmarks/measure.py). Reported: jobs/s,
its share of the ideal (concurrency / work time), the median over the rounds with its
spread (lowest and highest round), and asyncq against the Redis loop.

Systems (``--only``):

- ``asyncq``: ``App.run_worker(concurrency=c, drain=True)``, the batch size its own
  default (the concurrency plus the prefetch, at most 100), on a database of its own;
- ``baseline`` (``benchmarks.run --baseline REF`` only): the same, with asyncq as it was
  at REF, on a database of its own, in turns with the others;
- ``arq``: ``Worker(max_jobs=c, burst=True)``, at its default poll (0.5 s) and at 10 ms
  (``poll=10ms``); on Redis (benchmarks/redisdb.py);
- ``redis``: the bare list loop of benchmarks/systems/redis_list_system.py, c coroutines
  each LMOVE, work, LREM, INCR;
- ``sleep``: the sleeps alone, no queue (benchmarks/sleep_loop.py): c coroutines on
  uvloop each sleeping its share of the jobs in turn, timed from a line written to its
  process to the line it answers when done. Timer wake-ups run late, the more so as more
  coroutines share the loop. ``sleep tick``: the same, with the loop woken as asyncq's
  worker wakes it while short jobs run (asyncq.worker.tick), so that the timers fire on
  time: the ceiling of asyncq's drain on the machine, with no queue's work beside it.

Jobs per drain: ``--jobs-per-slot`` (625; quick 125) times the concurrency, so that each
drain lasts about as long at every concurrency (5,000 jobs at c=8, 3.1 s at the ideal
rate); arq at its default poll drains 25 per slot (200 at c=8), since it starts only
a few jobs per 0.5 s poll once its ``max_jobs`` slots fill. The systems take turns at each
concurrency, the order rotated from round to round. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import measure, redisdb, report
from benchmarks.common import (
    ROOT,
    describe,
    drop_database,
    median,
    recreate_database,
    run_async,
    server_facts,
)
from benchmarks.systems import Point, System, load

SYSTEMS = ("asyncq", "arq", "redis", "sleep")
# The rows: (system, variant); arq at its default poll and at 10 ms.
ROWS = {
    "asyncq": ("",),
    "baseline": ("",),  # benchmarks.run --baseline: asyncq at another commit
    "arq": ("", "poll=10ms"),
    "redis": ("",),
    "sleep": ("", "tick"),
}
ASYNCQ_ROWS = ("asyncq", "baseline")  # run_worker, at this tree or at --baseline's commit
REQUIRES = {"arq": ("arq", "redis"), "redis": ("redis",)}
CONCURRENCY = (8, 32, 128)
# arq at its default poll starts only a few jobs per 0.5 s poll at c=8 (18 jobs/s seen):
# its drains are shorter, 25 jobs per slot.
ARQ_DEFAULT_PER_SLOT = 25
WORK_MS = 5.0
RESULTS = ROOT / "benchmarks" / "results"


@dataclasses.dataclass(frozen=True)
class Options:
    admin_dsn: str
    redis_url: str
    concurrency: tuple[int, ...] = CONCURRENCY
    work_ms: float = WORK_MS
    jobs_per_slot: int = 625
    repeats: int = 3
    analyze: bool = True
    keep_databases: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace, admin_dsn: str, redis_url: str) -> Options:
        """The options of a shape part inside ``benchmarks.run`` (its rounds and --quick)."""
        return cls(
            admin_dsn=admin_dsn,
            redis_url=redis_url,
            jobs_per_slot=125 if args.quick else 625,
            repeats=args.repeats,
            analyze=args.analyze,
            keep_databases=args.keep_databases,
        )


def point_of(name: str, variant: str, concurrency: int) -> Point:
    if name in ASYNCQ_ROWS:
        return Point(concurrency, 0)  # run_worker's own batch size
    return Point(concurrency, 1, variant=variant)


def row_name(name: str, variant: str) -> str:
    return f"{name} {variant}".strip()


def database_of(name: str) -> str:
    """The database of the row ``name``: asyncq and its baseline each have their own."""
    return "shape" if name == "asyncq" else f"shape_{name}"


async def open_system(name: str, options: Options) -> System:
    for module in REQUIRES.get(name, ()):
        importlib.import_module(module)
    cls = load(name).SYSTEM
    if cls.uses_postgres:
        dsn = await recreate_database(options.admin_dsn, database_of(name))
    else:
        dsn = options.redis_url
    system: System = cls(dsn)
    await system.install()
    await system.open()
    return system


async def sleep_alone(
    concurrency: int, jobs: int, work_ms: float, *, tick: bool = False
) -> dict[str, Any]:
    """The drain of ``jobs`` sleeps of ``work_ms`` by ``concurrency`` coroutines, no queue
    (``tick``: the loop woken as asyncq's worker wakes it)."""
    per_slot = jobs // concurrency
    jobs = per_slot * concurrency
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.sleep_loop",
        str(concurrency),
        str(per_slot),
        f"{work_ms:g}",
        *(["tick"] if tick else []),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready = await proc.stdout.readline()
        started = time.perf_counter()
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        done = await proc.stdout.readline()
        seconds = time.perf_counter() - started
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    if (ready, done) != (b"ready\n", b"done\n"):
        return {"jobs": jobs, "ok": False, "error": "the sleep loop failed"}
    return {"jobs": jobs, "seconds": seconds, "rate": jobs / seconds, "ok": True}


async def run(
    options: Options,
    names: list[str],
    *,
    log_dir: Path,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every round: at each concurrency, one drain of each row, the order rotated."""
    work = options.work_ms / 1000
    problems: list[str] = []
    systems: dict[str, System] = {}
    for name in names:
        if name == "sleep":
            continue
        try:
            systems[name] = await open_system(name, options)
        except ImportError as exc:
            problems.append(f"{name}: not installed ({exc}); pip install -e '.[bench]'")
        except Exception as exc:  # noqa: BLE001 - a peer that cannot start is skipped
            problems.append(f"{name} setup: {type(exc).__name__}: {exc}")
    for problem in problems:
        say(f"  ! {problem}")
    rows = [(n, v) for n in names if n in systems or n == "sleep" for v in ROWS[n]]
    runs: list[dict[str, Any]] = []
    try:
        for repeat in range(1, options.repeats + 1):
            say(f"shape round {repeat} of {options.repeats}")
            for concurrency in options.concurrency:
                shift = (repeat - 1) % max(1, len(rows))
                for name, variant in rows[shift:] + rows[:shift]:
                    jobs = options.jobs_per_slot * concurrency
                    if name == "arq" and not variant:
                        jobs = min(jobs, ARQ_DEFAULT_PER_SLOT * concurrency)
                    where = f"{row_name(name, variant)} c={concurrency}"
                    try:
                        if name == "sleep":
                            result = await sleep_alone(
                                concurrency, jobs, options.work_ms, tick=variant == "tick"
                            )
                        else:
                            system = systems[name]
                            point = point_of(name, variant, concurrency)
                            result = await measure.throughput(
                                system,
                                point,
                                jobs,
                                log_dir,
                                analyze=options.analyze,
                                load=lambda n, s=system: s.enqueue_sleep_bulk(n, work),  # type: ignore[attr-defined]
                            )
                    except Exception as exc:  # noqa: BLE001 - one failed drain is reported
                        text = " ".join(str(exc).split()) or type(exc).__name__
                        problems.append(f"shape {where}: {type(exc).__name__}: {text}"[:600])
                        say(f"  ! {problems[-1]}")
                        continue
                    result.update(
                        system=name,
                        variant=variant,
                        concurrency=concurrency,
                        repeat=repeat,
                        ideal=concurrency / work,
                    )
                    runs.append(result)
                    if result["ok"]:
                        say(
                            f"  {where:24} {result['rate']:>9,.0f} jobs/s"
                            f"  {result['rate'] / result['ideal']:6.1%} of ideal"
                            f" ({jobs:,} jobs)"
                        )
                    else:
                        problems.append(f"shape {where}: {result.get('error')}")
                        say(f"  ! {problems[-1]}")
    finally:
        for name, system in systems.items():
            try:
                await system.close()
                if system.uses_postgres and not options.keep_databases:
                    await drop_database(options.admin_dsn, database_of(name))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{name} teardown: {type(exc).__name__}: {exc}")
    return {
        "work_ms": options.work_ms,
        "concurrency": list(options.concurrency),
        "jobs_per_slot": options.jobs_per_slot,
        "repeats": options.repeats,
        "systems": names,
        "rows": summarise(runs, options),
        "runs": runs,
        "errors": problems,
    }


def summarise(runs: list[dict[str, Any]], options: Options) -> list[dict[str, Any]]:
    """Per row and concurrency: the median rate over the rounds, its spread and share of
    the ideal, and (asyncq) its ratios to the Redis loop's median and the sleeps alone'."""
    out: list[dict[str, Any]] = []
    keys: list[tuple[str, str, int]] = []
    for run in runs:
        key = (run["system"], run["variant"], run["concurrency"])
        if key not in keys:
            keys.append(key)
    medians: dict[tuple[str, str, int], float] = {}
    for key in keys:
        rates = [
            r["rate"]
            for r in runs
            if r["ok"] and (r["system"], r["variant"], r["concurrency"]) == key
        ]
        if not rates:
            continue
        ideal = key[2] / (options.work_ms / 1000)
        mid = float(median(rates) or 0.0)
        medians[key] = mid
        jobs = next(r["jobs"] for r in runs if (r["system"], r["variant"], r["concurrency"]) == key)
        out.append(
            {
                "system": key[0],
                "variant": key[1],
                "concurrency": key[2],
                "jobs": jobs,
                "ideal": ideal,
                "median_rate": mid,
                "low": min(rates),
                "high": max(rates),
                "rates": rates,
                "of_ideal": mid / ideal,
            }
        )
    for row in out:
        redis = medians.get(("redis", "", row["concurrency"]))
        if row["system"] == "asyncq" and redis:
            row["vs_redis"] = row["median_rate"] / redis
        for variant, key in (("", "vs_sleep"), ("tick", "vs_sleep_tick")):
            sleep = medians.get(("sleep", variant, row["concurrency"]))
            if row["system"] in ASYNCQ_ROWS and sleep:
                row[key] = row["median_rate"] / sleep
    return out


def render(shape: dict[str, Any], *, durability: bool = True) -> str:
    head = (
        f"shape: {shape['work_ms']:g} ms of asyncio.sleep per job, one worker process,"
        f" {shape['jobs_per_slot']:,} jobs per slot; medians of {shape['repeats']} rounds,"
        " spread = lowest-highest round; ideal = concurrency / work time"
    )
    order = {n: i for i, n in enumerate(ROWS)}
    rows = sorted(
        shape["rows"],
        key=lambda r: (r["concurrency"], order.get(r["system"], 9), r["variant"]),
    )
    table = report._table(
        [
            "system",
            "c",
            "jobs",
            "jobs/s",
            "of ideal",
            "spread",
            "ideal",
            "vs Redis loop",
            "vs sleep alone",
            "vs sleep tick",
        ],
        [
            [
                row_name(r["system"], r["variant"]),
                str(r["concurrency"]),
                f"{r['jobs']:,}",
                f"{r['median_rate']:,.0f}",
                f"{r['of_ideal']:.1%}",
                f"{r['low']:,.0f}-{r['high']:,.0f}",
                f"{r['ideal']:,.0f}",
                f"{r['vs_redis']:.2f}x" if "vs_redis" in r else "",
                f"{r['vs_sleep']:.2f}x" if "vs_sleep" in r else "",
                f"{r['vs_sleep_tick']:.2f}x" if "vs_sleep_tick" in r else "",
            ]
            for r in rows
        ],
    )
    parts = [head, table]
    sleeps = {r["concurrency"]: r for r in rows if (r["system"], r["variant"]) == ("sleep", "")}
    ticked = {r["concurrency"]: r for r in rows if (r["system"], r["variant"]) == ("sleep", "tick")}
    targets = []
    for r in rows:
        if r["system"] != "asyncq":
            continue
        ideal_ok = r["of_ideal"] >= 0.95
        redis_ok = r.get("vs_redis", 0.0) > 1.0 if "vs_redis" in r else None
        verdict = "met" if ideal_ok and redis_ok is not False else "MISSED"
        versus = f", {r['vs_redis']:.2f}x the Redis loop" if "vs_redis" in r else ""
        sleep = sleeps.get(r["concurrency"])
        alone = f"; the sleeps alone: {sleep['of_ideal']:.1%} of ideal" if sleep else ""
        tick = ticked.get(r["concurrency"])
        alone += f", with the tick: {tick['of_ideal']:.1%}" if tick else ""
        targets.append(
            f"  c={r['concurrency']}: {r['of_ideal']:.1%} of ideal{versus}"
            f" (target: >= 95% and ahead of the Redis loop): {verdict}{alone}"
        )
    if targets:
        parts.append("asyncq against the target:\n" + "\n".join(targets))
    if durability and shape.get("redis"):
        parts.append(redisdb.durability(shape["redis"]))
    if shape["errors"]:
        parts.append("problems:\n" + "\n".join(f"  {e}" for e in shape["errors"]))
    return "\n\n".join(parts)


def chart(shape: dict[str, Any], path: Path) -> str | None:
    """Jobs/s as a share of the ideal against the concurrency, one line per row (the bars:
    lowest and highest round); None, or why it was not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    if not shape.get("rows"):
        return "no drain was measured"
    styles = {
        ("asyncq", ""): ("tab:blue", "o", "asyncq (run_worker, default batch)"),
        ("baseline", ""): ("tab:cyan", "o", "asyncq at the baseline's commit"),
        ("arq", ""): ("tab:red", "x", "arq, default poll 0.5 s"),
        ("arq", "poll=10ms"): ("tab:red", "X", "arq, poll 10 ms"),
        ("redis", ""): ("tab:gray", "s", "bare Redis LMOVE loop"),
        ("sleep", ""): ("darkgray", "_", "the sleeps alone, no queue"),
        ("sleep", "tick"): ("black", "^", "the sleeps alone, with asyncq's tick (the ceiling)"),
    }
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for key, (color, marker, label) in styles.items():
        rows = sorted(
            (r for r in shape["rows"] if (r["system"], r["variant"]) == key),
            key=lambda r: r["concurrency"],
        )
        if not rows:
            continue
        xs = [r["concurrency"] for r in rows]
        ys = [100 * r["of_ideal"] for r in rows]
        low = [100 * (r["median_rate"] - r["low"]) / r["ideal"] for r in rows]
        high = [100 * (r["high"] - r["median_rate"]) / r["ideal"] for r in rows]
        ax.errorbar(xs, ys, yerr=[low, high], marker=marker, color=color, label=label, capsize=3)
    ax.axhline(95, color="tab:blue", linestyle=":", linewidth=1, label="95% of ideal")
    xs = sorted({r["concurrency"] for r in shape["rows"]})
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.minorticks_off()
    ax.set_ylim(0, 105)
    ax.set(
        xlabel="concurrency",
        ylabel="% of ideal (concurrency / work time)",
        title=f"{shape['work_ms']:g} ms jobs, one worker process: medians of"
        f" {shape['repeats']} rounds (bars: lowest, highest)",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.shape",
        description="Short jobs at low concurrency: asyncq, arq, a bare Redis list loop and the"
        " sleeps alone.",
    )
    parser.add_argument("--dsn", help="PostgreSQL (a superuser; as benchmarks.run's --dsn)")
    parser.add_argument("--redis", help=f"Redis (default: {redisdb.DEFAULT_URL})")
    parser.add_argument("--quick", action="store_true", help="one round, 125 jobs per slot")
    parser.add_argument("--only", default=",".join(SYSTEMS), help="asyncq, arq, redis, sleep")
    parser.add_argument(
        "--concurrency",
        default=",".join(map(str, CONCURRENCY)),
        help="comma-separated (default: 8,32,128)",
    )
    parser.add_argument("--work-ms", type=float, default=WORK_MS, help="sleep per job (5)")
    parser.add_argument("--jobs-per-slot", type=int, help="jobs per drain / concurrency (625)")
    parser.add_argument("--repeats", type=int, help="rounds (default: 3; quick: 1)")
    parser.add_argument("--no-analyze", dest="analyze", action="store_false")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--keep-databases", action="store_true")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.only.split(",") if s.strip()]
    for name in args.systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r} (known: {', '.join(SYSTEMS)})")
    args.concurrency = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.jobs_per_slot = args.jobs_per_slot or (125 if args.quick else 625)
    return args


async def main(args: argparse.Namespace) -> int:
    from benchmarks.run import machine, resolve_dsn

    try:
        admin_dsn = resolve_dsn(args)
        server = await server_facts(admin_dsn)
    except Exception as exc:  # noqa: BLE001
        print(f"benchmarks.shape: cannot reach PostgreSQL: {exc}", file=sys.stderr)
        return 1
    redis_url = redisdb.resolve(args.redis)
    options = Options(
        admin_dsn=admin_dsn,
        redis_url=redis_url,
        concurrency=args.concurrency,
        work_ms=args.work_ms,
        jobs_per_slot=args.jobs_per_slot,
        repeats=args.repeats,
        analyze=args.analyze,
        keep_databases=args.keep_databases,
    )
    print(
        f"shape on {describe(admin_dsn)} (PostgreSQL {server['server_version']}) and"
        f" {redisdb.describe(redis_url)}; systems: {', '.join(args.systems)}",
        flush=True,
    )
    shape = await run(options, args.systems, log_dir=args.out / "logs")
    if any(n in args.systems for n in ("arq", "redis")):
        try:
            shape["redis"] = await redisdb.facts(redis_url)
        except Exception as exc:  # noqa: BLE001
            shape["errors"].append(f"redis facts: {exc}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    shape["meta"] = {
        "timestamp": stamp,
        "server": server,
        "machine": machine(),
        "command": " ".join(
            [os.path.basename(sys.executable), "-m", "benchmarks.shape", *sys.argv[1:]]
        ),
    }
    print()
    print(render(shape))
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(shape, indent=1, default=str)
    for path in (args.out / f"shape-{stamp}.json", args.out / "shape-latest.json"):
        path.write_text(text)
    why_not = chart(shape, args.out / "shape.png")
    print()
    print(f"results: {args.out / f'shape-{stamp}.json'} (and shape-latest.json)")
    print(f"chart: {why_not or args.out / 'shape.png'}")
    measured = any(r["system"] == "asyncq" for r in shape["rows"])
    return 0 if measured or "asyncq" not in args.systems else 1


def cli() -> None:
    args = parse_args()
    sys.exit(run_async(lambda: main(args)))


if __name__ == "__main__":
    cli()
