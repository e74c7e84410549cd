"""A drain from two start states, the only difference between them being what the table
held when the workers started (and planned their statements):

- ``warm``: the burst is written and analyzed, then the workers start;
- ``empty``: the empty table is analyzed (``VACUUM ANALYZE``: a new install, or the
  quiet hour after autovacuum found it empty), the workers start, then the burst comes;
  what production meets after every quiet night.

Both the same way otherwise: the queue is paused while the workers start and the burst is
written; the clock starts when it is resumed, with every worker connected and idle, and
stops when no job is left. Autovacuum is off for the table meanwhile, so that no
ANALYZE of the burst changes the plans halfway. asyncq (and its baseline) only: the pause
is asyncq's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks.common import connect, workers
from benchmarks.measure import POLL_INTERVAL, preload, tag_of, wait_until_done, worker_args
from benchmarks.systems import Point, System

STATES = ("warm", "empty")
QUEUE = "default"
# Workers connected, listening, their statements planned: idle.
SETTLE = 1.0
# A read of every row, which sets their hint bits (their inserts committed) in both states
# alike: the first to read a row after its insert does it, which an ANALYZE of the warm
# state did for the workers, but nothing did in the empty one.
HINTS = "SELECT count(*) FROM asyncq_jobs"


def points(quick: bool) -> list[Point]:
    """run_worker()'s defaults, and the configuration of the most throughput."""
    return [Point(10, 0)] if quick else [Point(10, 0), Point(200, 100)]


async def _table(system: System, *statements: str) -> None:
    async with await connect(system.dsn) as conn:
        for statement in statements:
            await conn.execute(statement)  # type: ignore[arg-type]


async def drain(system: Any, point: Point, jobs: int, log_dir: Path, state: str) -> dict[str, Any]:
    """One drain of ``jobs`` no-op jobs from ``state``; the result as the throughput
    part's, with the state."""
    await system.reset()
    await _table(system, "ALTER TABLE asyncq_jobs SET (autovacuum_enabled = off)")
    try:
        await system.app.pause(QUEUE)
        if state == "warm":
            await preload(system, jobs)
            await _table(system, "ANALYZE asyncq_jobs", HINTS, "CHECKPOINT")
        else:
            await _table(system, "VACUUM ANALYZE asyncq_jobs", "CHECKPOINT")
        tag = f"{tag_of(system, point)}-{state}"
        async with workers(
            worker_args(system, point, "serve"),
            point.processes,
            log_dir,
            tag,
            python=system.interpreter(),
        ) as procs:
            for proc in procs:
                proc.go()
            await asyncio.sleep(SETTLE)
            if state == "empty":
                await preload(system, jobs)
                await _table(system, HINTS, "CHECKPOINT")
            await system.unfinished()  # the probe's connection, opened before the clock starts
            started = time.perf_counter()
            await system.app.resume(QUEUE)
            finished = await wait_until_done(
                system, interval=POLL_INTERVAL, within=120 + jobs / 100
            )
        completed = await system.completed()
    finally:
        await system.close_probe()
        await _table(system, "ALTER TABLE asyncq_jobs RESET (autovacuum_enabled)")
        await system.app.resume(QUEUE)
    seconds = finished - started
    return {
        "state": state,
        "jobs": jobs,
        "seconds": seconds,
        "rate": jobs / seconds,
        "completed": completed,
        "ok": completed == jobs,
    }
