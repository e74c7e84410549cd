"""Workflows: asyncq against DBOS Transact and Absurd, three shapes, medians of rounds.

``python -m benchmarks.workflows [--dsn DSN] [--only asyncq,dbos,absurd] [--rounds 3]``

Each system on a database of its own (``asyncq_bench_wf_<system>``, recreated, dropped at
the end), its workers in processes of their own (benchmarks/workflows_<system>.py),
started, connected and idle for a second before each burst:

- ``throughput``: N workflows of three no-op steps; the clock runs from the start of the
  burst (the harness's enqueue, or DBOS's inline calls) until the harness sees the last
  one recorded done (it looks every 10 ms). asyncq: one worker process at each
  ``--concurrency``; DBOS: its queue, and workflows called inline from threads of the
  worker process; Absurd: its worker, at its default concurrency (1) and at 100.
- ``fanout``: a parent spawns N children (no-op) and gathers them, against N plain no-op
  jobs deferred at once, in turns (the first alternating between rounds), on the same
  worker: the time from the defer of the parent (of the jobs) until it (the last) is done.
- ``events``: one waiter at a time, on an idle worker: a workflow waits for an event; once
  its wait is recorded, 10-20 ms later, the harness emits the event with its
  ``time.time()`` as the payload; the waiter's code, running again, reports the time
  since, first thing. p50/p95 of each round.

The rounds take the systems in turn, their order rotated from round to round. DBOS
(``pip install dbos``) and Absurd (``pip install absurd-sdk``, and its SQL, which is not
part of this repository: ``--absurd-sql``) are skipped, with a line saying how to get
them, when missing. Nothing here asserts a timing; the report goes to stdout and to
benchmarks/results/workflows-<time>.txt, every run's figures to the .json beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    WorkerProcess,
    connect,
    describe,
    drop_database,
    median,
    percentile,
    recreate_database,
    run_async,
    server_facts,
    workers,
)

RESULTS = ROOT / "benchmarks" / "results"
LOGS = RESULTS / "logs"
SYSTEMS = ["asyncq", "dbos", "absurd"]
SHAPES = ["throughput", "fanout", "events"]
POLL = 0.01  # how often the harness looks for the end of a burst
SETTLE = 1.0  # after a worker says READY and is told to go, before the burst
GAP = (0.010, 0.020)  # the pause before each emit, once the waiter's wait is recorded
WARMUP = 5  # events before the samples
DBOS_THREADS = 8  # DBOS's inline calls: threads of its worker process
PEER_CONCURRENCY = 100  # the peers' workers where a concurrency is set


@dataclass(frozen=True)
class Config:
    """One worker configuration of a system: its label and its worker's arguments;
    ``inline``: DBOS's workflows called from that many threads of the worker process."""

    label: str
    args: tuple[str, ...]
    inline: int = 0


@dataclass
class Report:
    """Every run's figures by key (shape, system, configuration), and what went wrong."""

    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    deadlocks: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, run: dict[str, Any]) -> None:
        self.runs.setdefault(key, []).append(run)


def loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_=." else "_" for c in label)


def say(line: str) -> None:
    print(line, flush=True)


# The worker processes of the burst in progress: a wait for their work ends if one exits.
RUNNING: list[WorkerProcess] = []


async def until(check: Callable[[], Awaitable[bool]], within: float, what: str) -> float:
    """Poll ``check`` every `POLL` until it holds; the perf_counter time then."""
    deadline = time.perf_counter() + within
    while True:
        if await check():
            return time.perf_counter()
        for proc in RUNNING:
            if proc.proc.returncode is not None:
                raise RuntimeError(
                    f"the worker exited ({proc.proc.returncode}) before {what}: see {LOGS}"
                )
        if time.perf_counter() > deadline:
            raise TimeoutError(f"not within {within:.0f}s: {what}")
        await asyncio.sleep(POLL)


@contextlib.asynccontextmanager
async def idle_worker(system: Any, config: Config, tag: str) -> AsyncIterator[WorkerProcess]:
    """The system's tables emptied, and one worker process of ``config``, idle."""
    await system.reset()
    async with workers(list(config.args), 1, LOGS, tag, module=system.module) as (proc,):
        proc.go()
        await asyncio.sleep(SETTLE)
        RUNNING.append(proc)
        try:
            yield proc
        finally:
            RUNNING.remove(proc)


def burst(
    n: int, started: float, ended: float, enqueued: float | None, load: float | None
) -> dict[str, Any]:
    """A burst's figures; ``enqueued``: when its enqueue returned (None: no enqueue, as
    DBOS's inline calls)."""
    seconds = ended - started
    return {
        "n": n,
        "seconds": seconds,
        "rate": n / seconds,
        "enqueue_seconds": None if enqueued is None else enqueued - started,
        "load": load,
    }


async def latencies(
    proc: WorkerProcess,
    samples: int,
    start: Callable[[int], Awaitable[Any]],
    waiting: Callable[[Any], Awaitable[bool]],
    emit: Callable[[int, Any], Awaitable[None]],
) -> dict[str, Any]:
    """One waiter at a time: ``start(i)`` makes it, ``waiting(it)`` says its wait is
    recorded, ``emit(i, it)`` wakes it; the worker reports each latency."""
    load = loadavg()
    found: list[float] = []
    for i in range(samples + WARMUP):
        waiter = await start(i)

        async def recorded(waiter: Any = waiter) -> bool:
            return await waiting(waiter)

        await until(recorded, 60, f"waiter {waiter} waiting")
        await asyncio.sleep(random.uniform(*GAP))
        await emit(i, waiter)
        latency = await proc.next_latency(60)
        if i >= WARMUP:
            found.append(latency * 1000)
    return {
        "samples": len(found),
        "p50_ms": percentile(found, 50),
        "p95_ms": percentile(found, 95),
        "max_ms": max(found),
        "load": load,
        "latencies_ms": found,
    }


# -- the systems ---------------------------------------------------------------------------


class AsyncqDriver:
    name = "asyncq"

    def __init__(self, args: argparse.Namespace, dsn: str) -> None:
        from benchmarks.workflows_asyncq import AsyncqWorkflows

        self.args = args
        self.system = AsyncqWorkflows(dsn)

    async def prepare(self) -> None:
        await self.system.install()
        await self.system.open()

    async def close(self) -> None:
        await self.system.close()

    def config(self, concurrency: int) -> Config:
        default = " (default)" if concurrency == 10 else ""
        return Config(f"c={concurrency}{default}", tuple(self.system.worker_args(concurrency)))

    def throughput_configs(self) -> list[Config]:
        return [self.config(c) for c in self.args.concurrency]

    def fanout_config(self) -> Config:
        return self.config(self.args.fanout_concurrency)

    def events_configs(self) -> list[Config]:
        return [self.config(10)]

    def workflows(self) -> int:
        return int(self.args.workflows)

    def children(self) -> int:
        return int(self.args.children)

    async def throughput(self, config: Config, n: int, tag: str) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag):
            load, started = loadavg(), time.perf_counter()
            await s.defer_workflows(n)
            enqueued = time.perf_counter()
            ended = await until(lambda: _not(s.unfinished()), 900, f"{n} workflows")
        done, steps = await s.done(), await s.steps()
        if done != n or steps != 3 * n:
            raise RuntimeError(f"{done} workflows of {n} done, {steps} steps of {3 * n}")
        return burst(n, started, ended, enqueued, load)

    async def fanout(self, config: Config, n: int, tag: str, plain: bool) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag):
            load, started = loadavg(), time.perf_counter()
            if plain:
                await s.defer_plain(n)
                enqueued = time.perf_counter()
                ended = await until(lambda: _not(s.unfinished()), 900, f"{n} jobs")
            else:
                parent = await s.defer_fanout(n)
                enqueued = time.perf_counter()
                ended = await until(lambda: s.ended(parent), 900, f"a gather of {n}")
        done = await s.done()
        if done != (n if plain else n + 1):
            raise RuntimeError(f"{done} jobs done of {n if plain else n + 1}")
        if not plain and await s.result(parent) != n:
            raise RuntimeError("the parent did not gather every child")
        return burst(n, started, ended, enqueued, load)

    async def events(self, config: Config, samples: int, tag: str) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag) as proc:

            async def start(i: int) -> int:
                return int(await s.defer_waiter(f"{tag}-{i}"))

            async def emit(i: int, _: Any) -> None:
                await s.emit(f"{tag}-{i}", time.time())

            return await latencies(proc, samples, start, s.waiting, emit)


class DbosDriver:
    name = "dbos"

    def __init__(self, args: argparse.Namespace, dsn: str) -> None:
        from benchmarks.workflows_dbos import DbosWorkflows

        self.args = args
        self.system = DbosWorkflows(dsn)
        self.args_of = tuple(self.system.worker_args(PEER_CONCURRENCY))

    async def prepare(self) -> None:
        # DBOS makes its schema when it launches; its client needs it.
        async with workers(
            list(self.args_of), 1, LOGS, "wf-dbos-launch", module=self.system.module
        ):
            pass
        await self.system.open()

    async def close(self) -> None:
        await self.system.close()

    def throughput_configs(self) -> list[Config]:
        return [
            Config("queue", self.args_of),
            Config(f"inline, {DBOS_THREADS} threads", self.args_of, inline=DBOS_THREADS),
        ]

    def fanout_config(self) -> Config:
        return Config(f"children queue worker_concurrency={PEER_CONCURRENCY}", self.args_of)

    def events_configs(self) -> list[Config]:
        return [Config("recv/send", self.args_of)]

    def workflows(self) -> int:
        return int(self.args.peer_workflows)

    def children(self) -> int:
        return int(self.args.peer_children)

    async def throughput(self, config: Config, n: int, tag: str) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag) as proc:
            load, started = loadavg(), time.perf_counter()
            if config.inline:
                proc.send(f"inline {n} {config.inline}")
                line = await proc.next_line(900)
                if not line.startswith("DONE "):
                    raise RuntimeError(f"the worker said {line!r}")
                ended, enqueued = time.perf_counter(), None
            else:
                await s.enqueue("wf3", n)
                enqueued = time.perf_counter()
                ended = await until(lambda: _at_least(s.succeeded("wf3"), n), 900, f"{n} wf3")
        steps = await s.steps()
        if await s.succeeded("wf3") != n or steps != 3 * n:
            raise RuntimeError(f"{await s.succeeded('wf3')} of {n} done, {steps} steps")
        return burst(n, started, ended, enqueued, load)

    async def fanout(self, config: Config, n: int, tag: str, plain: bool) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag):
            load, started = loadavg(), time.perf_counter()
            if plain:
                await s.enqueue("child", n)
                enqueued = time.perf_counter()
                ended = await until(lambda: _at_least(s.succeeded("child"), n), 900, f"{n} jobs")
            else:
                (handle,) = await s.enqueue("fanout", 1, n)
                parent = handle.get_workflow_id()
                enqueued = time.perf_counter()
                ended = await until(lambda: _is(s.result(parent), "SUCCESS"), 900, "a gather")
        if await s.succeeded("child") != n:
            raise RuntimeError(f"{await s.succeeded('child')} children done of {n}")
        return burst(n, started, ended, enqueued, load)

    async def events(self, config: Config, samples: int, tag: str) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag) as proc:

            async def start(i: int) -> str:
                workflow_id = f"{tag}-{i}"
                proc.send(f"wait {workflow_id}")
                return workflow_id

            async def emit(_: int, workflow_id: Any) -> None:
                await s.send(str(workflow_id))

            return await latencies(proc, samples, start, s.waiting, emit)


class AbsurdDriver:
    name = "absurd"

    def __init__(self, args: argparse.Namespace, dsn: str, sql: str) -> None:
        from benchmarks.workflows_absurd import AbsurdWorkflows

        self.args = args
        self.system = AbsurdWorkflows(dsn, sql)

    async def prepare(self) -> None:
        await self.system.install()
        await self.system.open()

    async def close(self) -> None:
        await self.system.close()

    def config(self, concurrency: int, poll: float = 0.25) -> Config:
        label = f"c={concurrency}{' (default)' if concurrency == 1 else ''}, poll {poll:g}s"
        return Config(label, tuple(self.system.worker_args(concurrency, poll)))

    def throughput_configs(self) -> list[Config]:
        return [self.config(1), self.config(PEER_CONCURRENCY)]

    def fanout_config(self) -> Config:
        return self.config(PEER_CONCURRENCY)

    def events_configs(self) -> list[Config]:
        return [self.config(1), self.config(1, 0.01)]

    def workflows(self) -> int:
        return int(self.args.peer_workflows)

    def children(self) -> int:
        return int(self.args.peer_children)

    async def throughput(self, config: Config, n: int, tag: str) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag):
            load, started = loadavg(), time.perf_counter()
            await s.spawn("wf3", n)
            enqueued = time.perf_counter()
            ended = await until(lambda: _at_least(s.completed("default"), n), 900, f"{n} wf3")
        steps = await s.steps()
        if await s.completed("default") != n or steps != 3 * n:
            raise RuntimeError(f"{await s.completed('default')} of {n} done, {steps} steps")
        return burst(n, started, ended, enqueued, load)

    async def fanout(self, config: Config, n: int, tag: str, plain: bool) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag):
            load, started = loadavg(), time.perf_counter()
            if plain:
                await s.spawn("child", n)
                enqueued = time.perf_counter()
                ended = await until(lambda: _at_least(s.completed("children"), n), 900, "jobs")
            else:
                (parent,) = await s.spawn("fanout", 1, {"n": n})
                enqueued = time.perf_counter()
                ended = await until(lambda: _is(s.state(parent), "completed"), 900, "a gather")
        if await s.completed("children") != n:
            raise RuntimeError(f"{await s.completed('children')} children done of {n}")
        return burst(n, started, ended, enqueued, load)

    async def events(self, config: Config, samples: int, tag: str) -> dict[str, Any]:
        s = self.system
        async with idle_worker(s, config, tag) as proc:

            async def start(i: int) -> str:
                (task_id,) = await s.spawn("waiter", 1, {"key": f"{tag}-{i}"})
                return task_id

            async def emit(i: int, _: Any) -> None:
                await s.emit(f"{tag}-{i}", time.time())

            return await latencies(proc, samples, start, s.waiting, emit)


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


async def _at_least(value: Awaitable[int], n: int) -> bool:
    return await value >= n


async def _is(value: Awaitable[Any], expected: Any) -> bool:
    return bool(await value == expected)


# -- the run -------------------------------------------------------------------------------


async def make_drivers(args: argparse.Namespace, admin: str, report: Report) -> list[Any]:
    """The drivers of the systems asked for that can run here, each on its fresh database."""
    drivers: list[Any] = []
    for name in args.only:
        if name == "dbos":
            from benchmarks import workflows_dbos

            why = workflows_dbos.missing()
            if why:
                report.skipped[name] = why
                say(f"dbos skipped: {why}")
                continue
            report.versions["dbos"] = workflows_dbos.version()
        if name == "absurd":
            from benchmarks import workflows_absurd

            why = workflows_absurd.missing()
            sql = ""
            if why is None:
                try:
                    sql, where = workflows_absurd.load_sql(args.absurd_sql)
                except FileNotFoundError as exc:
                    why = str(exc)
                else:
                    report.versions["absurd"] = f"absurd-sdk {workflows_absurd.version()}, {where}"
            if why:
                report.skipped[name] = why
                say(f"absurd skipped: {why}")
                continue
        dsn = await recreate_database(admin, f"wf_{name}")
        if name == "asyncq":
            drivers.append(AsyncqDriver(args, dsn))
        elif name == "dbos":
            drivers.append(DbosDriver(args, dsn))
        else:
            drivers.append(AbsurdDriver(args, dsn, sql))
    return drivers


async def measure(args: argparse.Namespace, drivers: list[Any], report: Report) -> None:
    for number in range(1, args.rounds + 1):
        turn = (number - 1) % len(drivers) if drivers else 0
        for driver in drivers[turn:] + drivers[:turn]:
            if driver.name in report.skipped:
                continue
            try:
                await one_round(args, driver, report, number)
            except Exception as exc:  # noqa: BLE001 - one system's failure is reported
                report.problems.append(
                    f"round {number}, {driver.name}: {type(exc).__name__}: {exc}"
                )
                say(f"round {number} {driver.name}: {type(exc).__name__}: {exc}")
                if os.environ.get("BENCH_TRACEBACKS"):
                    traceback.print_exc()


async def one_round(args: argparse.Namespace, driver: Any, report: Report, number: int) -> None:
    name = driver.name
    if "throughput" in args.shapes:
        for config in driver.throughput_configs():
            tag = f"wf-{name}-throughput-{slug(config.label)}"
            run = await driver.throughput(config, driver.workflows(), tag)
            report.add(f"throughput|{name}|{config.label}", run)
            say(
                f"round {number} throughput {name} {config.label}: {run['rate']:,.0f}"
                f" workflows/s ({run['n']:,} in {run['seconds']:.2f}s,"
                f" {_enqueue(run)}load {run['load']})"
            )
    if "fanout" in args.shapes:
        config = driver.fanout_config()
        for plain in [False, True] if number % 2 else [True, False]:
            what = "plain" if plain else "fanout"
            run = await driver.fanout(config, driver.children(), f"wf-{name}-{what}", plain)
            report.add(f"{what}|{name}|{config.label}", run)
            say(
                f"round {number} {what} {name} {config.label}: {run['n']:,} in"
                f" {run['seconds']:.3f}s (load {run['load']})"
            )
    if "events" in args.shapes:
        samples = args.samples if name == "asyncq" else args.peer_samples
        for config in driver.events_configs():
            run = await driver.events(config, samples, f"wf-{name}-events")
            report.add(f"events|{name}|{config.label}", run)
            say(
                f"round {number} events {name} {config.label}: p50 {run['p50_ms']:.2f} ms,"
                f" p95 {run['p95_ms']:.2f} ms (load {run['load']})"
            )


def _enqueue(run: dict[str, Any]) -> str:
    seconds = run["enqueue_seconds"]
    return "" if seconds is None else f"enqueue {seconds:.2f}s, "


async def deadlocks(dsn: str) -> int:
    async with await connect(dsn) as conn:
        row = await (
            await conn.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            )
        ).fetchone()
    return int(row[0]) if row else 0


def commit() -> str:
    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    sha = git("rev-parse", "--short", "HEAD") or "?"
    return sha + (" with changes to asyncq/" if git("status", "--porcelain", "asyncq") else "")


async def main(args: argparse.Namespace) -> int:
    from benchmarks.run import machine, resolve_dsn

    admin = resolve_dsn(args)
    LOGS.mkdir(parents=True, exist_ok=True)
    report = Report()
    report.versions["asyncq"] = commit()
    facts = await server_facts(admin)
    started = datetime.now(UTC)
    drivers = await make_drivers(args, admin, report)
    try:
        ready = []
        for driver in drivers:
            try:
                await driver.prepare()
                ready.append(driver)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot start is reported
                report.skipped[driver.name] = f"could not start: {type(exc).__name__}: {exc}"
                say(f"{driver.name} skipped: {report.skipped[driver.name]}")
        await measure(args, ready, report)
        await asyncio.sleep(1.0)  # statistics are flushed once a second
        for driver in drivers:
            report.deadlocks[driver.name] = await deadlocks(driver.system.dsn)
    finally:
        for driver in drivers:
            with contextlib.suppress(Exception):
                await driver.close()
            if not args.keep_databases:
                await drop_database(admin, f"wf_{driver.name}")
    summary: dict[str, Any] = {
        "when": started.isoformat(),
        "server": describe(admin),
        "settings": facts,
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k != "dsn"},
        "versions": report.versions,
        "runs": report.runs,
        "medians": medians(report.runs),
        "deadlocks": report.deadlocks,
        "problems": report.problems,
        "skipped": report.skipped,
    }
    summary["targets"] = targets(summary["medians"])
    text = render(summary)
    print()
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = f"{started:%Y%m%dT%H%M%S}"
    for path in (RESULTS / f"workflows-{stamp}.json", RESULTS / "workflows-latest.json"):
        path.write_text(json.dumps(summary, indent=2))
    (RESULTS / f"workflows-{stamp}.txt").write_text(text + "\n")
    say(f"written to benchmarks/results/workflows-{stamp}.json and .txt")
    asyncq_ran = any(key.split("|")[1] == "asyncq" for key in report.runs)
    return 0 if asyncq_ran or "asyncq" not in args.only else 1


# -- the report ----------------------------------------------------------------------------


def medians(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per key: the medians over the rounds, the lowest and highest, and the loads."""
    out: dict[str, dict[str, Any]] = {}
    for key, found in runs.items():
        shape = key.split("|")[0]
        fields = ["p50_ms", "p95_ms"] if shape == "events" else ["rate", "seconds"]
        entry: dict[str, Any] = {"rounds": len(found), "n": found[0].get("n")}
        for name in fields:
            values = [r[name] for r in found]
            entry[name] = median(values)
            entry[f"{name}_range"] = [min(values), max(values)]
        loads = [r["load"] for r in found if r.get("load") is not None]
        entry["load_range"] = [min(loads), max(loads)] if loads else None
        out[key] = entry
    # fan-out against plain jobs: the ratio of the medians, and the median of the rounds'
    for key, found in runs.items():
        shape, name, label = key.split("|")
        plain = runs.get(f"plain|{name}|{label}")
        if shape != "fanout" or not plain:
            continue
        pairs = [f["seconds"] / p["seconds"] for f, p in zip(found, plain, strict=False)]
        out[f"ratio|{name}|{label}"] = {
            "ratio": out[key]["seconds"] / out[f"plain|{name}|{label}"]["seconds"],
            "round_ratios": pairs,
            "median_round_ratio": median(pairs),
        }
    return out


def best(meds: dict[str, dict[str, Any]], system: str) -> tuple[str, float] | None:
    rates = [
        (key.split("|")[2], entry["rate"])
        for key, entry in meds.items()
        if key.startswith(f"throughput|{system}|")
    ]
    return max(rates, key=lambda item: item[1]) if rates else None


def targets(meds: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    ours, dbos = best(meds, "asyncq"), best(meds, "dbos")
    if ours:
        found.append(
            {
                "target": "3-step workflows, one worker process: >= 5,000/s",
                "value": f"{ours[1]:,.0f}/s at {ours[0]}",
                "met": ours[1] >= 5000,
            }
        )
    if ours and dbos:
        found.append(
            {
                "target": "asyncq >= 25x DBOS (best of each, this run)",
                "value": f"{ours[1] / dbos[1]:.0f}x ({ours[1]:,.0f} against {dbos[1]:,.0f}/s,"
                f" DBOS {dbos[0]})",
                "met": ours[1] / dbos[1] >= 25,
            }
        )
    for key, entry in meds.items():
        if key.startswith("ratio|asyncq|"):
            # The ratio of the medians and the median of the rounds' ratios: when one is
            # within the bar and the other is not, the run cannot tell.
            within = {entry["ratio"] <= 1.5, entry["median_round_ratio"] <= 1.5}
            found.append(
                {
                    "target": "fan-out of N children + gather <= 1.5x N plain jobs",
                    "value": f"{entry['ratio']:.2f}x"
                    f" (rounds' median {entry['median_round_ratio']:.2f}x)",
                    "met": within.pop() if len(within) == 1 else None,
                }
            )
    for key, entry in meds.items():
        if key.startswith("events|asyncq|"):
            found.append(
                {
                    "target": "an emitted event wakes its waiter, p50 <= 5 ms",
                    "value": f"p50 {entry['p50_ms']:.2f} ms, p95 {entry['p95_ms']:.2f} ms",
                    "met": entry["p50_ms"] <= 5,
                }
            )
    return found


def _spread(entry: dict[str, Any], name: str, fmt: str) -> str:
    low, high = entry[f"{name}_range"]
    return f"{format(low, fmt)}-{format(high, fmt)}"


def render(summary: dict[str, Any]) -> str:
    meds = summary["medians"]
    facts, args = summary["settings"], summary["args"]
    versions = summary["versions"]
    lines = [
        f"Workflows, {summary['when'][:19]}Z: PostgreSQL {facts.get('server_version')}"
        f" ({summary['server']}), {summary['machine'].get('cores')} cores,"
        f" {args['rounds']} round(s); medians, [lowest-highest round]",
        "versions: " + "; ".join(f"{k} {v}" for k, v in versions.items()),
    ]
    loads = [value for entry in meds.values() for value in (entry.get("load_range") or [])]
    if loads:
        lines.append(f"load average at the runs' starts: {min(loads):.2f}-{max(loads):.2f}")
    rows = [(k, e) for k, e in meds.items() if k.startswith("throughput|")]
    if rows:
        lines += ["", "Workflows of 3 no-op steps, workers started before the burst"]
        lines.append(f"  {'system':<8} {'configuration':<28} {'N':>7} {'workflows/s':>12}  rounds")
        for key, entry in rows:
            _, name, label = key.split("|")
            lines.append(
                f"  {name:<8} {label:<28} {entry['n']:>7,} {entry['rate']:>12,.0f}"
                f"  [{_spread(entry, 'rate', ',.0f')}]"
            )
    rows = [(k, e) for k, e in meds.items() if k.startswith("fanout|")]
    if rows:
        lines += ["", "Fan-out of N children and their gather, against N plain jobs (seconds)"]
        lines.append(
            f"  {'system':<8} {'N':>7} {'fan-out':>9} {'plain':>9} {'ratio':>7}"
            "  rounds' ratios (their median)   worker"
        )
        for key, entry in rows:
            _, name, label = key.split("|")
            plain = meds.get(f"plain|{name}|{label}")
            ratio = meds.get(f"ratio|{name}|{label}")
            if plain is None or ratio is None:
                continue
            pairs = " ".join(f"{r:.2f}" for r in ratio["round_ratios"])
            lines.append(
                f"  {name:<8} {entry['n']:>7,} {entry['seconds']:>9.3f} {plain['seconds']:>9.3f}"
                f" {ratio['ratio']:>6.2f}x  {pairs} ({ratio['median_round_ratio']:.2f}x)   {label}"
            )
    rows = [(k, e) for k, e in meds.items() if k.startswith("events|")]
    if rows:
        lines += ["", "An emitted event wakes its waiter (emit to the waiter's code, ms, idle)"]
        lines.append(f"  {'system':<8} {'configuration':<28} {'p50':>8} {'p95':>8}  rounds' p50")
        for key, entry in rows:
            _, name, label = key.split("|")
            lines.append(
                f"  {name:<8} {label:<28} {entry['p50_ms']:>8.2f} {entry['p95_ms']:>8.2f}"
                f"  [{_spread(entry, 'p50_ms', '.2f')}]"
            )
    if summary["targets"]:
        lines += ["", "Targets"]
        for target in summary["targets"]:
            mark = {True: "met", False: "MISSED", None: "cannot tell"}[target["met"]]
            lines.append(f"  {target['target']}: {target['value']}: {mark}")
    if any(summary["deadlocks"].values()):
        lines += [
            "",
            "deadlocks detected: " + ", ".join(f"{k} {v}" for k, v in summary["deadlocks"].items()),
        ]
    for name, why in summary["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    for problem in summary["problems"]:
        lines.append(f"problem: {problem}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows")
    parser.add_argument("--dsn", help="a superuser's (default: $ASYNCQ_BENCH_DSN, else embedded)")
    parser.add_argument("--only", default=",".join(SYSTEMS), help="of: " + ",".join(SYSTEMS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round, smaller sizes")
    parser.add_argument("--workflows", type=int, default=20_000, help="asyncq's per burst")
    parser.add_argument("--concurrency", default="10,50,100,200", help="asyncq's workers")
    parser.add_argument("--fanout-concurrency", type=int, default=100, help="asyncq's")
    parser.add_argument("--children", type=int, default=10_000, help="asyncq's fan-out")
    parser.add_argument("--samples", type=int, default=200, help="asyncq's events per round")
    parser.add_argument("--peer-workflows", type=int, default=1_000)
    parser.add_argument("--peer-children", type=int, default=1_000)
    parser.add_argument("--peer-samples", type=int, default=100)
    parser.add_argument(
        "--absurd-sql",
        default=os.environ.get("ABSURD_SQL"),
        help="Absurd's sql/absurd.sql: the file, a clone, or a git directory (or $ABSURD_SQL)",
    )
    parser.add_argument("--keep-databases", action="store_true")
    args = parser.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    for name in args.only:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r}")
    for name in args.shapes:
        if name not in SHAPES:
            parser.error(f"unknown shape {name!r}")
    if args.quick:
        args.rounds = 1
        args.workflows = min(args.workflows, 5_000)
        args.samples = min(args.samples, 50)
        args.peer_workflows = min(args.peer_workflows, 300)
        args.peer_children = min(args.peer_children, 300)
        args.peer_samples = min(args.peer_samples, 20)
    return args


if __name__ == "__main__":
    sys.exit(run_async(lambda: main(parse_args(sys.argv[1:]))))
