"""The three measurements every system gets: drain throughput, pickup latency, enqueue rates."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from psycopg import sql

from benchmarks.common import WorkerProcess, connect, percentile, workers
from benchmarks.systems import SHORT_GAP, Point, System, time_calls

POLL_INTERVAL = 0.01
PRELOAD_CHUNK = 5000


@dataclass(frozen=True)
class Sizes:
    jobs: int  # pre-loaded jobs per throughput run
    latency_jobs: int
    one_by_one: int
    concurrent: int
    coroutines: int
    bulk: int
    bulk_chunk: int


def worker_args(system: System, point: Point, mode: str) -> list[str]:
    path = system.import_path()
    return [
        system.name,
        "--dsn",
        system.dsn,
        "--mode",
        mode,
        "--concurrency",
        str(point.concurrency),
        "--batch",
        str(point.batch),
        "--variant",
        point.variant,
        *(["--path", path] if path else []),
    ]


async def settle(system: System, *, analyze: bool = True) -> None:
    """ANALYZE what was just loaded (as autovacuum would) and CHECKPOINT, so that every
    run starts from the same state and no checkpoint falls inside the timed part.
    Nothing for a system that keeps its jobs outside PostgreSQL (arq)."""
    if not system.uses_postgres:
        return
    async with await connect(system.dsn) as conn:
        if analyze:
            for table in system.tables:
                await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
        await conn.execute("CHECKPOINT")


async def preload(
    system: System, count: int, load: Callable[[int], Awaitable[None]] | None = None
) -> float:
    """Write ``count`` no-op jobs with the bulk API (or ``count`` jobs with ``load``, which
    writes the number of jobs it is given); returns the seconds it took."""
    load = load or system.enqueue_bulk
    started = time.perf_counter()
    left = count
    while left > 0:
        chunk = min(PRELOAD_CHUNK, left)
        await load(chunk)
        left -= chunk
    return time.perf_counter() - started


async def wait_until_done(system: System, *, interval: float, within: float) -> float:
    """Poll `System.unfinished` until it is false; returns the perf_counter time then."""
    deadline = time.perf_counter() + within
    while True:
        unfinished = await system.unfinished()
        now = time.perf_counter()
        if not unfinished:
            return now
        if now > deadline:
            raise TimeoutError(f"{system.name}: jobs still unfinished after {within:.0f}s")
        await asyncio.sleep(interval)


def tag_of(system: System, point: Point) -> str:
    tag = f"{system.name}-c{point.concurrency}-b{point.batch}-p{point.processes}{point.variant}"
    return "".join(c if c.isalnum() or c in "-_=." else "_" for c in tag)


async def throughput(
    system: System,
    point: Point,
    jobs: int,
    log_dir: Path,
    wrapper: tuple[str, ...] = (),
    *,
    analyze: bool = True,
    load: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Pre-load ``jobs`` (no-op jobs, or what ``load`` writes), start ``point.processes``
    workers, time until none is left."""
    await system.reset()
    load_seconds = await preload(system, jobs, load)
    await settle(system, analyze=analyze)
    tag = tag_of(system, point)
    try:
        async with workers(
            worker_args(system, point, "drain"),
            point.processes,
            log_dir,
            tag,
            wrapper,
            python=system.interpreter(),
        ) as procs:
            await system.unfinished()  # the probe's connection, opened before the clock starts
            for proc in procs:
                proc.go()
            started = time.perf_counter()
            finished = await wait_until_done(
                system, interval=POLL_INTERVAL, within=120 + jobs / 100
            )
            exits = [await proc.wait_exit(30) for proc in procs]
        completed = await system.completed()
    finally:
        await system.close_probe()
    seconds = finished - started
    result = {
        "jobs": jobs,
        "seconds": seconds,
        "rate": jobs / seconds,
        "completed": completed,
        "ok": completed == jobs,
        "exit_codes": exits,
        "preload_rate": jobs / load_seconds,
    }
    codes = [proc.code for proc in procs if proc.code]
    if codes:
        result["code"] = codes
    if not result["ok"]:
        result["error"] = f"{completed} of {jobs} jobs completed: {procs[0].error_tail()}"
    return result


async def latency(system: System, point: Point, count: int, log_dir: Path) -> dict[str, Any]:
    """An idle worker; one job at a time, 10-20 ms apart (`System.latency_gap`: longer for
    a worker that polls); seconds from just before the enqueue call to the first line of
    the task body, as both read time.time()."""
    await system.reset()
    await settle(system)
    tag = tag_of(system, point).replace("-p1", "-latency")
    args = worker_args(system, point, "serve")
    async with workers(args, 1, log_dir, tag, python=system.interpreter()) as (proc,):
        proc.go()
        await asyncio.sleep(1.0)  # connected, listening, idle
        samples: list[float] = []
        gap = system.latency_gap(point)
        for i in range(count + 5):
            await asyncio.sleep(random.uniform(*gap))
            sent_at = time.time()
            await system.enqueue_stamp(sent_at)
            value = await proc.next_latency(within=15.0)
            if i >= 5:  # the first five warm up both sides
                samples.append(value)
    return _latency_result(samples, proc)


async def latency_in_turns(systems: list[System], count: int, log_dir: Path) -> dict[str, Any]:
    """`latency` of several systems at once, each sample's system taking its turn.

    Every system's idle worker runs throughout; one job at a time, 10-20 ms apart, each
    turn sending one to every system in a shuffled order, so that the systems' samples
    come from the same seconds. Returns each system's result by name."""
    for system in systems:
        await system.reset()
        await settle(system)
    async with contextlib.AsyncExitStack() as stack:
        procs = {}
        for system in systems:
            args = worker_args(system, system.latency_point(), "serve")
            tag = f"{system.name}-latency"
            (procs[system.name],) = await stack.enter_async_context(
                workers(args, 1, log_dir, tag, python=system.interpreter())
            )
        for proc in procs.values():
            proc.go()
        await asyncio.sleep(1.0)  # connected, listening, idle
        samples: dict[str, list[float]] = {system.name: [] for system in systems}
        for i in range(count + 5):
            for system in random.sample(systems, len(systems)):
                await asyncio.sleep(random.uniform(*SHORT_GAP))
                sent_at = time.time()
                await system.enqueue_stamp(sent_at)
                value = await procs[system.name].next_latency(within=15.0)
                if i >= 5:
                    samples[system.name].append(value)
    return {name: _latency_result(samples[name], procs[name]) for name in samples}


def _latency_result(samples: list[float], proc: WorkerProcess) -> dict[str, Any]:
    ms = [s * 1000 for s in samples]
    return {
        **({"code": [proc.code]} if proc.code else {}),
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "max_ms": max(ms),
        "mean_ms": sum(ms) / len(ms),
        "samples_ms": [round(v, 3) for v in ms],
    }


BLOCKS = 10
# Blocks of `enqueue_in_turns`'s concurrent part (quick: 200 jobs each, full: 1,000).
CONCURRENT_BLOCKS = 5
K = TypeVar("K")


async def _interleaved(calls: dict[K, Any], count: int) -> dict[K, float]:
    """Rates of calls made one after another, ``count`` of each, measured in turns.

    The calls take turns in blocks of ``count / BLOCKS`` (their order shuffled in each
    turn), so that the ratios between them come from the same minutes on a machine
    whose speed drifts."""
    for call in calls.values():
        await time_calls(call, 20)  # warm-up: connections, prepared statements
    spent = dict.fromkeys(calls, 0.0)
    block = max(1, count // BLOCKS)
    for _ in range(BLOCKS):
        for name in random.sample(list(calls), len(calls)):
            spent[name] += await time_calls(calls[name], block)
    return {name: block * BLOCKS / seconds for name, seconds in spent.items()}


async def enqueue(system: System, sizes: Sizes) -> dict[str, Any]:
    """Jobs/s written: one by one, from concurrent coroutines, and with the batch API."""
    result: dict[str, Any] = {}
    await system.reset()
    await settle(system)
    calls = {"one_by_one": system.one_by_one(), **system.extra_enqueue()}
    result.update(await _interleaved(calls, sizes.one_by_one))

    if system.supports_concurrent_enqueue:
        await system.reset()
        each = sizes.concurrent // sizes.coroutines
        seconds = await system.enqueue_concurrent(sizes.coroutines, each)
        result["concurrent"] = each * sizes.coroutines / seconds

    if system.bulk_note:  # no batch API: nothing to measure
        return result
    await system.reset()
    await settle(system)
    await system.enqueue_bulk(sizes.bulk_chunk)  # warm-up
    started = time.perf_counter()
    left = sizes.bulk
    while left > 0:
        chunk = min(sizes.bulk_chunk, left)
        await system.enqueue_bulk(chunk)
        left -= chunk
    result["bulk"] = sizes.bulk / (time.perf_counter() - started)
    return result


async def enqueue_in_turns(systems: list[System], sizes: Sizes) -> dict[str, dict[str, Any]]:
    """`enqueue` of several systems (asyncq and its baseline) with every part in turns.

    One by one: the first system's calls (with its references, as in `enqueue`) and the
    others' `System.in_turns` calls, in the blocks of `_interleaved`. From concurrent
    coroutines: `CONCURRENT_BLOCKS` blocks of ``sizes.concurrent / CONCURRENT_BLOCKS``
    jobs each, the systems taking turns. Bulk: one call of ``sizes.bulk_chunk`` jobs at a
    time, the systems taking turns. The order in every turn is shuffled. Returns each
    system's result by name, with the same keys as `enqueue`'s."""
    first, others = systems[0], systems[1:]
    for system in systems:
        await system.reset()
        await settle(system)
    calls: dict[tuple[str, str], Any] = {
        (first.name, "one_by_one"): first.enqueue_one,
        **{(first.name, k): call for k, call in first.extra_enqueue().items()},
    }
    for other in others:
        calls.update({(other.name, k): call for k, call in other.in_turns().items()})
    results: dict[str, dict[str, Any]] = {system.name: {} for system in systems}
    for (name, kind), rate in (await _interleaved(calls, sizes.one_by_one)).items():
        results[name][kind] = rate

    each = max(1, sizes.concurrent // sizes.coroutines // CONCURRENT_BLOCKS)
    spent = {system.name: 0.0 for system in systems}
    for system in systems:
        await system.reset()
        await system.enqueue_concurrent_setup(sizes.coroutines)
    try:

        async def producer(system: System) -> None:
            for _ in range(each):
                await system.enqueue_concurrent_one()

        for system in systems:
            await asyncio.gather(*(system.enqueue_concurrent_one() for _ in range(20)))
        for _ in range(CONCURRENT_BLOCKS):
            for system in random.sample(systems, len(systems)):
                started = time.perf_counter()
                await asyncio.gather(*(producer(system) for _ in range(sizes.coroutines)))
                spent[system.name] += time.perf_counter() - started
    finally:
        for system in systems:
            await system.enqueue_concurrent_teardown()
    for name, seconds in spent.items():
        results[name]["concurrent"] = each * sizes.coroutines * CONCURRENT_BLOCKS / seconds

    calls_each = max(1, sizes.bulk // sizes.bulk_chunk)
    spent = {system.name: 0.0 for system in systems}
    for system in systems:
        await system.reset()
        await settle(system)
    for system in systems:
        await system.enqueue_bulk(sizes.bulk_chunk)  # warm-up
    for _ in range(calls_each):
        for system in random.sample(systems, len(systems)):
            started = time.perf_counter()
            await system.enqueue_bulk(sizes.bulk_chunk)
            spent[system.name] += time.perf_counter() - started
    for name, seconds in spent.items():
        results[name]["bulk"] = calls_each * sizes.bulk_chunk / seconds
    return results
