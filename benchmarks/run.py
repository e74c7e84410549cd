"""Run the benchmarks: ``python -m benchmarks.run [--quick] [--dsn DSN] [--only asyncq,sql]``.

Every selected system gets its own fresh database on the same server; the repeats
go round-robin over the systems so that each ratio is measured side by side.
``--baseline REF`` adds asyncq as it was at the commit REF (system ``baseline``),
measured in turns with the working tree's asyncq, configuration by configuration.
It prints one report, writes benchmarks/results/<timestamp>.json and latest.json,
and draws benchmarks/results/throughput.png. It exits 0 when a peer cannot be
installed or run (the report says why) and 1 only when asyncq itself (or, with
``--baseline``, the baseline) could not be measured or the database is unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import (
    baseline,
    ceiling,
    history,
    measure,
    memory,
    profile,
    redisdb,
    report,
    shape,
    starts,
)
from benchmarks import river as river_module
from benchmarks.common import (
    ROOT,
    describe,
    drop_database,
    recreate_database,
    run_async,
    server_facts,
)
from benchmarks.river import HOW_TO_BUILD, River
from benchmarks.river import binary as river_binary
from benchmarks.systems import ORDER, SHORT_GAP, Point, System, load

PARTS = ("throughput", "starts", "latency", "enqueue", "ceiling", "history", "memory", "shape")
REQUIRES = {
    "procrastinate": ("procrastinate",),
    "pgqueuer": ("pgqueuer", "asyncpg"),
    "saq": ("saq", "psycopg_pool"),
    "arq": ("arq", "redis"),
}
# Names --only also takes, measured in the shape part only: the bare Redis list loop, and
# the shape's sleeps alone.
SHAPE_ONLY = ("redis", "sleep")
# Peers measured through their own benchmark command, not as a System (River's `river bench`).
CLI_PEERS = ("river",)
RESULTS = ROOT / "benchmarks" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="asyncq against procrastinate, PgQueuer, oban-py, saq, arq (on Redis) and"
        " plain SQL on one PostgreSQL.",
    )
    parser.add_argument(
        "--dsn",
        help="a PostgreSQL server to create the benchmark databases on (a superuser:"
        " it runs CREATE DATABASE and CHECKPOINT); default: $ASYNCQ_BENCH_DSN, else the"
        " embedded PostgreSQL",
    )
    parser.add_argument(
        "--redis",
        help="the Redis of arq and of the shape part's list loop, with a database number of"
        f" their own (default: $ASYNCQ_BENCH_REDIS, else {redisdb.DEFAULT_URL}); only their own"
        " keys are deleted",
    )
    parser.add_argument("--quick", action="store_true", help="a short run (under two minutes)")
    parser.add_argument(
        "--only",
        default=",".join(ORDER + list(CLI_PEERS) + list(SHAPE_ONLY)),
        help="systems to run, comma-separated (default:"
        f" {','.join(ORDER + list(CLI_PEERS) + list(SHAPE_ONLY))}; river is River's own"
        " `river bench` (benchmarks/river.py), redis is the shape part's bare Redis loop,"
        " sleep its sleeps alone)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also measure asyncq as it was at the commit REF (e.g. a tag or a sha),"
        " in turns with the working tree's asyncq, and report the ratios (needs asyncq"
        " among --only)",
    )
    parser.add_argument(
        "--parts",
        help=f"what to measure, comma-separated, of: {','.join(PARTS)} (default: all but memory;"
        " quick: all but memory and shape)",
    )
    parser.add_argument("--memory", action="store_true", help="add the memory soak to --parts")
    parser.add_argument("--repeats", type=int, help="runs of everything (default: 3; quick: 1)")
    parser.add_argument(
        "--ceiling-rounds",
        type=int,
        help="rounds of the ceiling part: asyncq and plain SQL back to back (default: 11;"
        " quick: 1)",
    )
    parser.add_argument(
        "--ceiling-jobs",
        type=int,
        help="jobs per drain of the ceiling part (default: 50,000; quick: as --jobs)",
    )
    parser.add_argument("--jobs", type=int, help="jobs per drain (default: 20,000; quick: 5,000)")
    parser.add_argument(
        "--states",
        default=",".join(starts.STATES),
        help=f"the start states of the starts part (default: {','.join(starts.STATES)})",
    )
    parser.add_argument(
        "--backlog-jobs",
        type=int,
        help="jobs queued when the workers start, starts part's backlog state (default:"
        " 1,000,000; quick: 20,000)",
    )
    parser.add_argument(
        "--finished-jobs",
        type=int,
        help="finished jobs in the table, starts part's history state (default: 5,000,000;"
        " quick: 50,000)",
    )
    parser.add_argument("--latency-jobs", type=int, help="pickup samples (default: 200; quick: 50)")
    parser.add_argument(
        "--history-rows",
        type=int,
        help="finished rows for the claim check (default: 1,000,000; quick: 100,000)",
    )
    parser.add_argument(
        "--memory-jobs", type=int, default=1_000_000, help="jobs for the memory soak"
    )
    parser.add_argument(
        "--bulk-chunk", type=int, default=1000, help="jobs per bulk enqueue call (default: 1000)"
    )
    parser.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="do not ANALYZE the job tables after each pre-load (autovacuum may still)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile one asyncq drain with py-spy"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument(
        "--keep-databases", action="store_true", help="leave the asyncq_bench_* databases"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 3)
    args.ceiling_rounds = args.ceiling_rounds or (1 if quick else 11)
    args.jobs = args.jobs or (5_000 if quick else 20_000)
    args.ceiling_jobs = args.ceiling_jobs or (args.jobs if quick else 50_000)
    args.latency_jobs = args.latency_jobs or (50 if quick else 200)
    args.history_rows = args.history_rows or (100_000 if quick else 1_000_000)
    args.backlog_jobs = args.backlog_jobs or (20_000 if quick else 1_000_000)
    args.finished_jobs = args.finished_jobs or (50_000 if quick else 5_000_000)
    args.states = [s.strip() for s in args.states.split(",") if s.strip()]
    for state in args.states:
        if state not in starts.STATES:
            parser.error(f"unknown state {state!r} (known: {', '.join(starts.STATES)})")
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.parts is None:
        args.parts = "throughput,starts,latency,enqueue,ceiling,history" + (
            "" if quick else ",shape"
        )
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if args.memory:
        args.parts.add("memory")
    for name in names:
        if name not in ORDER and name not in SHAPE_ONLY and name not in CLI_PEERS:
            known = ", ".join(ORDER + list(CLI_PEERS) + list(SHAPE_ONLY))
            parser.error(f"unknown system {name!r} (known: {known})")
    args.systems = [name for name in names if name in ORDER]
    args.river = "river" in names
    args.shape_systems = [name for name in shape.SYSTEMS if name in names]
    args.redis_url = redisdb.resolve(args.redis)
    for part in args.parts:
        if part not in PARTS:
            parser.error(f"unknown part {part!r} (known: {', '.join(PARTS)})")
    args.baseline_commit = None
    if args.baseline:
        if "asyncq" not in args.systems:
            parser.error("--baseline compares with asyncq: add asyncq to --only")
        try:
            args.baseline_commit = baseline.resolve(args.baseline)
        except ValueError as exc:
            parser.error(f"--baseline: {exc}")
        args.systems.insert(args.systems.index("asyncq") + 1, "baseline")
        if "asyncq" in args.shape_systems:
            args.shape_systems.insert(args.shape_systems.index("asyncq") + 1, "baseline")
    return args


def sizes(args: argparse.Namespace) -> measure.Sizes:
    quick = args.quick
    return measure.Sizes(
        jobs=args.jobs,
        latency_jobs=args.latency_jobs,
        one_by_one=300 if quick else 2000,
        concurrent=1000 if quick else 5000,
        coroutines=50,
        bulk=5_000 if quick else 20_000,
        bulk_chunk=args.bulk_chunk,
    )


def scaling(name: str, quick: bool) -> list[Point]:
    counts = (2,) if quick else (2, 4)
    if name in ("asyncq", "baseline"):
        return [Point(100, 100, processes=n) for n in counts]
    if name == "sql":
        return [Point(10, 100, processes=n, variant="batched") for n in counts]
    return []


def resolve_dsn(args: argparse.Namespace) -> str:
    if args.dsn:
        return str(args.dsn)
    if os.environ.get("ASYNCQ_BENCH_DSN"):
        return os.environ["ASYNCQ_BENCH_DSN"]
    from asyncq import embedded

    return embedded.start()


def machine() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                facts["memory_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return facts


def versions() -> dict[str, str]:
    found = {}
    dists = ("asyncq", "procrastinate", "pgqueuer", "saq", "arq", "redis", "psycopg", "asyncpg")
    for dist in (*dists, "uvloop"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[dist] = importlib.metadata.version(dist)
    return found


def peer_versions(systems: list[System]) -> dict[str, str]:
    """Versions known only to a system (oban's, in its own virtualenv)."""
    found = {}
    for system in systems:
        version = getattr(system, "version", None)
        if isinstance(version, str):
            found[system.name] = version
    return found


def git_state() -> dict[str, Any]:
    """The commit measured, and whether asyncq/ had uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "asyncq_dirty": bool(git("status", "--porcelain", "--", "asyncq")),
    }


def point_dict(point: Point) -> dict[str, Any]:
    return {**dataclasses.asdict(point), "label": point.label}


def in_turn(group: list[System], turn: int) -> list[System]:
    """The group in its order on even turns, reversed on odd ones."""
    return group if turn % 2 == 0 else group[::-1]


class Runner:
    def __init__(self, args: argparse.Namespace, admin_dsn: str) -> None:
        self.args = args
        self.admin_dsn = admin_dsn
        self.log_dir = args.out / "logs"
        self.results: dict[str, Any] = {
            "throughput": [],
            "starts": [],
            "latency": [],
            "enqueue": [],
            "river": [],
            "river_pickup": [],
            "errors": [],
        }
        self.systems: list[System] = []
        self.river: River | None = None

    def say(self, text: str) -> None:
        print(text, flush=True)

    def problem(self, where: str, exc: BaseException) -> str:
        text = " ".join(str(exc).split()) or type(exc).__name__
        message = f"{where}: {type(exc).__name__}: {text}"[:600]
        self.results["errors"].append(message)
        self.say(f"  ! {message}")
        return message

    async def guarded(
        self, where: str, call: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        try:
            return await call()
        except Exception as exc:  # noqa: BLE001 - a failing system must not stop the others
            if os.environ.get("BENCH_TRACEBACKS"):
                traceback.print_exc()
            return {"error": self.problem(where, exc)}

    async def prepare(self) -> None:
        for name in self.args.systems:
            try:
                for module in REQUIRES.get(name, ()):
                    importlib.import_module(module)
                cls = load(name).SYSTEM
            except ImportError as exc:
                self.problem(name, ImportError(f"not installed ({exc}); pip install -e '.[bench]'"))
                continue
            try:
                if cls.uses_postgres:
                    dsn = await recreate_database(self.admin_dsn, name)
                else:
                    dsn = self.args.redis_url
                    self.results["redis"] = await redisdb.facts(dsn)
                system = cls(dsn)
                if name == "baseline":
                    system.title = self.args.baseline_commit.title
                await system.install()
                await system.open()
            except Exception as exc:  # noqa: BLE001
                self.problem(f"{name} setup", exc)
                continue
            self.systems.append(system)
        if self.args.river:
            await self.prepare_river()
        code = {s.name: s.code() for s in self.systems}
        mine, imported = ROOT / "asyncq", code.get("asyncq")
        if imported is not None and imported.resolve() != mine.resolve():
            self.problem("asyncq", RuntimeError(f"imported from {imported}, not {mine}"))
        self.results["code"] = {name: str(path) for name, path in code.items() if path}

    async def prepare_river(self) -> None:
        path = river_binary()
        if path is None:
            self.problem("river", FileNotFoundError(HOW_TO_BUILD))
            return
        try:
            dsn = await recreate_database(self.admin_dsn, "river")
            river = River(path, dsn, self.log_dir)
            await river.install()
        except Exception as exc:  # noqa: BLE001
            self.problem("river setup", exc)
            return
        self.river = river
        self.results["river_meta"] = {
            "binary": str(path),
            "version": river.version,
            "settings": river_module.SETTINGS,
            "defaults": river_module.DEFAULTS,
            "pickup_settings": river_module.PICKUP_SETTINGS,
        }
        if "latency" in self.args.parts and river_module.pickup_binary(path) is None:
            self.say(f"  river pickup skipped: no river-pickup beside {path}; {HOW_TO_BUILD}")

    def sizes_of_starts(self) -> starts.Sizes:
        return starts.Sizes(
            burst=sizes(self.args).jobs,
            backlog=self.args.backlog_jobs,
            finished=self.args.finished_jobs,
        )

    async def measure_river(self, repeat: int) -> None:
        """River's own bench, stock: TRUNCATE and VACUUM FULL, insert, work down."""
        assert self.river is not None
        jobs = sizes(self.args).jobs
        load = starts.load()
        run = await self.guarded("river throughput", lambda: self.river.bench(jobs))  # type: ignore[union-attr]
        run.update(repeat=repeat, load=load)
        self.results["river"].append(run)
        if run.get("ok"):
            self.say(f"  {'river':13} {'river bench, stock':28} {run['rate']:>9,.0f} jobs/s")

    async def measure_river_pickup(self, repeat: int) -> None:
        """River's pickup by river-pickup, at River's defaults and at its bench's tuning."""
        assert self.river is not None
        if river_module.pickup_binary(self.river.path) is None:
            return
        for setting in river_module.PICKUP_SETTINGS:
            load = starts.load()
            count = sizes(self.args).latency_jobs
            lat = await self.guarded(
                f"river pickup {setting}", partial(self.river.pickup, count, setting)
            )
            lat.update(system="river", setting=setting, repeat=repeat, load=load)
            self.results["river_pickup"].append(lat)
            if "error" not in lat:
                self.say(
                    f"  {'river':13} pickup p50 {lat['p50_ms']:.2f} ms"
                    f"  p95 {lat['p95_ms']:.2f} ms ({setting})"
                )

    async def measure_river_start(self, state: str, repeat: int) -> None:
        assert self.river is not None
        run = await self.guarded(
            f"river from {state}",
            partial(starts.river_drain, self.river, self.sizes_of_starts(), state),
        )
        run.update(system="river", point=point_dict(Point(2000, 0, variant="river bench")))
        workers = os.environ.get("RIVER_BENCH_MAX_WORKERS", "2000")
        run["label"] = f"river bench, MaxWorkers {int(workers):,}"
        run.update(repeat=repeat, state=state)
        self.results["starts"].append(run)
        if run.get("ok"):
            label = "river bench"
            self.say(f"  {'river':13} {label:17} from {state:7} {run['rate']:>9,.0f} jobs/s")

    def groups(self) -> list[list[System]]:
        """The systems in their order; asyncq and its baseline form one group, whose
        members take turns at each measurement instead of one after the other."""
        names = [s.name for s in self.systems]
        out: list[list[System]] = []
        for system in self.systems:
            if system.name == "baseline" and "asyncq" in names:
                continue
            group = [system]
            if system.name == "asyncq" and "baseline" in names:
                group.append(self.systems[names.index("baseline")])
            out.append(group)
        return out

    def check_code(self, system: System, run: dict[str, Any]) -> None:
        """A run of a worker that did not run the system's own copy of asyncq is no run."""
        expected = system.code()
        if expected is None or "error" in run:
            return
        wrong = [
            c
            for c in run.get("code", [None])
            if c is None or Path(c).resolve().parent != expected.resolve()
        ]
        if wrong:
            run["ok"] = False
            run["error"] = self.problem(
                f"{system.name} worker code",
                RuntimeError(f"a worker ran {wrong[0] or 'unknown code'}, not {expected}"),
            )

    async def measure_throughput(self, system: System, point: Point, repeat: int) -> None:
        name = system.name
        jobs = system.drain_jobs(point, sizes(self.args).jobs)
        run = await self.guarded(
            f"{name} throughput {point.label}",
            partial(
                measure.throughput,
                system,
                point,
                jobs,
                self.log_dir,
                analyze=self.args.analyze,
            ),
        )
        run.update(system=name, point=point_dict(point), repeat=repeat)
        if "error" in run and "ok" not in run:
            run["ok"] = False
        self.check_code(system, run)
        self.results["throughput"].append(run)
        if run.get("ok"):
            self.say(f"  {name:13} {point.label:28} {run['rate']:>9,.0f} jobs/s ({jobs:,} jobs)")
        elif "error" in run and "rate" in run:
            self.problem(f"{name} throughput {point.label}", RuntimeError(run["error"]))

    async def measure_start(self, system: System, point: Point, state: str, repeat: int) -> None:
        name = system.name
        run = await self.guarded(
            f"{name} from {state} {point.label}",
            partial(starts.drain, system, point, self.sizes_of_starts(), self.log_dir, state),
        )
        run.update(system=name, point=point_dict(point), repeat=repeat, state=state)
        if "error" in run and "ok" not in run:
            run["ok"] = False
        self.results["starts"].append(run)
        if run.get("ok"):
            self.say(f"  {name:13} {point.label:17} from {state:7} {run['rate']:>9,.0f} jobs/s")

    async def measure_starts(self, repeat: int) -> None:
        """Every system from each start state in turn (asyncq and its baseline taking turns
        within a state), River's bench last in each."""
        for state in self.args.states:
            for group in self.groups():
                for point in starts.points(group[0].name, self.args.quick):
                    for system in in_turn(group, repeat - 1):
                        await self.measure_start(system, point, state, repeat)
            if self.river is not None:
                await self.measure_river_start(state, repeat)

    async def measure_latency(self, group: list[System], repeat: int) -> None:
        """Pickup latency of one system, or of a group's systems taking turns sample by
        sample (`measure.latency_in_turns`)."""
        names = [system.name for system in group]
        count, log_dir = sizes(self.args).latency_jobs, self.log_dir

        async def run() -> dict[str, Any]:
            if len(group) > 1:
                return await measure.latency_in_turns(group, count, log_dir)
            system = group[0]
            point = system.latency_point()
            return {system.name: await measure.latency(system, point, count, log_dir)}

        found = await self.guarded(f"{' and '.join(names)} latency", run)
        for system in group:
            lat = {"error": found["error"]} if "error" in found else found[system.name]
            lat.update(system=system.name, repeat=repeat, point=point_dict(system.latency_point()))
            self.record_latency(system, lat)
        if len(group) == 1:
            # More configurations of one system (arq at a shorter poll than its default).
            system = group[0]
            for point in system.latency_points()[1:]:
                lat = await self.guarded(
                    f"{system.name} latency {point.label}",
                    partial(measure.latency, system, point, count, log_dir),
                )
                lat.update(system=system.name, repeat=repeat, point=point_dict(point), extra=True)
                self.record_latency(system, lat)

    def record_latency(self, system: System, lat: dict[str, Any]) -> None:
        self.check_code(system, lat)
        self.results["latency"].append(lat)
        if "error" not in lat:
            where = f" ({lat['point']['label']})" if lat.get("extra") else ""
            self.say(
                f"  {system.name:13} pickup p50 {lat['p50_ms']:.2f} ms"
                f"  p95 {lat['p95_ms']:.2f} ms{where}"
            )

    async def measure_enqueue(self, group: list[System], repeat: int) -> None:
        """Enqueue rates of one system, or of a group's systems taking turns at every part
        (`measure.enqueue_in_turns`)."""
        names = [system.name for system in group]
        size = sizes(self.args)

        async def run() -> dict[str, Any]:
            if len(group) > 1:
                return await measure.enqueue_in_turns(group, size)
            return {group[0].name: await measure.enqueue(group[0], size)}

        found = await self.guarded(f"{' and '.join(names)} enqueue", run)
        for system in group:
            enq = {"error": found["error"]} if "error" in found else found[system.name]
            enq.update(system=system.name, repeat=repeat)
            self.results["enqueue"].append(enq)
            if "error" not in enq:
                rates = ", ".join(f"{k} {v:,.0f}/s" for k, v in enq.items() if isinstance(v, float))
                self.say(f"  {system.name:13} enqueue: {rates}")

    async def one_round(self, repeat: int) -> None:
        parts = self.args.parts
        for group in self.groups():
            if "throughput" in parts:
                # asyncq and its baseline drain back to back at each configuration, in
                # the same order all round (so that neither drains twice in a row: a
                # drain right after one of the same system's ran slower), the one that
                # goes first alternating from one round to the next.
                first = group[0]
                for point in first.sweep(self.args.quick) + scaling(first.name, self.args.quick):
                    for system in in_turn(group, repeat - 1):
                        await self.measure_throughput(system, point, repeat)
            if "enqueue" in parts:
                await self.measure_enqueue(group, repeat)
        if parts & {"throughput", "starts"} and self.river is not None:
            await self.measure_river(repeat)
        if "starts" in parts:
            await self.measure_starts(repeat)
        if "latency" in parts:
            # Pickup differences between systems are a fraction of a millisecond, less than
            # the machine's drift from one minute to the next: the systems whose idle
            # workers wake on a notification take turns sample by sample; one that polls
            # (arq, whose samples need pauses as long as its poll) is measured on its own.
            turns = [s for s in self.systems if s.latency_gap(s.latency_point()) == SHORT_GAP]
            if turns:
                await self.measure_latency(turns, repeat)
            for system in self.systems:
                if system not in turns:
                    await self.measure_latency([system], repeat)
            if self.river is not None:
                await self.measure_river_pickup(repeat)

    def best_asyncq_point(self) -> Point:
        """asyncq's fastest single-process configuration so far (c=100 b=100 if none)."""
        best = report.summarise({**self.results, "latency": [], "enqueue": []})["best"]
        row = best.get("asyncq")
        if row is None:
            return Point(100, 100)
        p = row["point"]
        return Point(p["concurrency"], p["batch"], p["processes"], p["variant"])

    async def run(self) -> dict[str, Any]:
        args = self.args
        started = time.perf_counter()
        await self.prepare()
        rounds = args.repeats if args.parts & {"throughput", "starts", "latency", "enqueue"} else 0
        for repeat in range(1, rounds + 1):
            self.say(f"round {repeat} of {args.repeats}")
            await self.one_round(repeat)
        names = [s.name for s in self.systems]
        if "ceiling" in args.parts and {"asyncq", "sql"} <= set(names):
            self.say(f"ceiling: asyncq and plain SQL back to back, {args.ceiling_rounds} rounds")
            by_name = {s.name: s for s in self.systems}
            self.results["ceiling"] = await self.guarded(
                "ceiling",
                lambda: ceiling.run(
                    by_name["asyncq"],
                    by_name["sql"],
                    rounds=args.ceiling_rounds,
                    jobs=args.ceiling_jobs,
                    bulk_chunk=args.bulk_chunk,
                    log_dir=self.log_dir,
                    analyze=args.analyze,
                    say=self.say,
                ),
            )
        if "shape" in args.parts and args.shape_systems:
            self.say(f"shape: {', '.join(args.shape_systems)}")
            self.results["shape"] = await self.guarded(
                "shape",
                lambda: shape.run(
                    shape.Options.of(args, self.admin_dsn, args.redis_url),
                    args.shape_systems,
                    log_dir=self.log_dir,
                    say=self.say,
                ),
            )
            if {"arq", "redis"} & set(args.shape_systems) and "rows" in self.results["shape"]:
                with contextlib.suppress(Exception):
                    self.results["shape"]["redis"] = await redisdb.facts(args.redis_url)
        if "history" in args.parts and "asyncq" in names:
            self.say(f"claim cost against {args.history_rows:,} finished rows")
            self.results["history"] = await self.guarded(
                "history",
                lambda: history.run(
                    self.admin_dsn,
                    rows=args.history_rows,
                    backlog=1000,
                    drain_jobs=args.jobs,
                    log_dir=self.log_dir,
                ),
            )
        if "memory" in args.parts and "asyncq" in names:
            self.say(f"memory soak: {args.memory_jobs:,} jobs")
            self.results["memory"] = await self.guarded(
                "memory",
                lambda: memory.run(
                    self.admin_dsn,
                    total=args.memory_jobs,
                    point=Point(100, 100),
                    log_dir=self.log_dir,
                ),
            )
        if args.profile and "asyncq" in names:
            asyncq_system = next(s for s in self.systems if s.name == "asyncq")
            point = self.best_asyncq_point()
            self.say(f"profile of an asyncq drain ({point.label})")
            self.results["profile"] = await self.guarded(
                "profile",
                lambda: profile.run(asyncq_system, point, args.jobs, args.out, self.log_dir),
            )
        for system in self.systems:
            try:
                await system.close()
                if not args.keep_databases and system.uses_postgres:
                    await drop_database(self.admin_dsn, system.name)
            except Exception as exc:  # noqa: BLE001
                self.problem(f"{system.name} teardown", exc)
        if self.river is not None and not args.keep_databases:
            try:
                await drop_database(self.admin_dsn, "river")
            except Exception as exc:  # noqa: BLE001
                self.problem("river teardown", exc)
        if not args.keep_databases:
            for extra in ("history", "memory"):
                await drop_database(self.admin_dsn, extra)
        self.results["elapsed_s"] = time.perf_counter() - started
        self.results["systems"] = names
        return self.results


async def main(args: argparse.Namespace) -> int:
    try:
        admin_dsn = resolve_dsn(args)
        server = await server_facts(admin_dsn)
    except Exception as exc:  # noqa: BLE001
        print(f"benchmarks: cannot reach PostgreSQL: {exc}", file=sys.stderr)
        return 1
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    print(
        f"benchmarks on {describe(admin_dsn)} (PostgreSQL {server['server_version']},"
        f" synchronous_commit={server['synchronous_commit']}); systems: {', '.join(args.systems)}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="asyncq-baseline-") as scratch:
        if args.baseline_commit is not None:
            try:
                package = baseline.extract(args.baseline_commit, Path(scratch))
            except Exception as exc:  # noqa: BLE001
                print(f"benchmarks: --baseline {args.baseline}: {exc}", file=sys.stderr)
                return 1
            sys.path.append(str(package.parent))
            print(f"baseline: {args.baseline_commit.title} from {package}", flush=True)
        runner = Runner(args, admin_dsn)
        results = await runner.run()
    results["titles"] = {s.name: s.title for s in runner.systems}
    if runner.river is not None:
        results["titles"]["river"] = runner.river.title
    results["bulk_notes"] = {s.name: s.bulk_note for s in runner.systems if s.bulk_note}
    results["defaults"] = {
        s.name: point_dict(p) for s in runner.systems if (p := s.default_point()) is not None
    }
    results["meta"] = {
        "timestamp": stamp,
        "mode": "quick" if args.quick else "full",
        "repeats": args.repeats,
        "jobs": args.jobs,
        "sizes": dataclasses.asdict(sizes(args)),
        "starts": {
            "states": args.states,
            "burst": args.jobs,
            "backlog_jobs": args.backlog_jobs,
            "finished_jobs": args.finished_jobs,
        },
        "parts": sorted(args.parts),
        "analyze_after_preload": args.analyze,
        "dsn": describe(admin_dsn),
        "server": server,
        "machine": machine(),
        "versions": {**versions(), **peer_versions(runner.systems)},
        "git": git_state(),
        "command": " ".join(
            [os.path.basename(sys.executable), "-m", "benchmarks.run", *sys.argv[1:]]
        ),
    }
    if args.baseline_commit is not None:
        results["meta"]["baseline"] = dataclasses.asdict(args.baseline_commit)
    results["summary"] = report.summarise(results)
    results["targets"] = report.targets(results["summary"], results)
    if "baseline" in results["systems"]:
        results["before_after"] = report.before_after(results)
    print()
    print(report.render(results))
    if "profile" in results:
        print()
        print(profile.render(results["profile"]))
    why_not = report.chart(results, args.out / "throughput.png")
    if "rows" in results.get("shape", {}):
        shape_why_not = shape.chart(results["shape"], args.out / "shape.png")
        print(f"shape chart: {shape_why_not or args.out / 'shape.png'}")
    paths = report.write_json(results, args.out, stamp)
    print()
    print(f"results: {paths[0]} (and {paths[1].name})")
    print(f"chart: {why_not or args.out / 'throughput.png'}")
    print(f"took {results['elapsed_s']:.0f}s")
    # asyncq, its baseline, and plain SQL (asyncq's own table and claim, so that a change
    # of asyncq's schema can break it): each must have drained, where it was asked for.
    for name in ("asyncq", "baseline", "sql"):
        if name in args.systems:
            for part in ("throughput", "starts"):
                measured = any(r.get("ok") for r in results[part] if r["system"] == name)
                if part in args.parts and not measured:
                    return 1
    return 0


def cli() -> None:
    args = parse_args()
    sys.exit(run_async(lambda: main(args)))


if __name__ == "__main__":
    cli()
