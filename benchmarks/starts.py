"""Drains from four start states, every system from each, the only difference between the
states being what the table held when the workers started (and planned their statements):

- ``empty``: the empty table is analyzed (``VACUUM ANALYZE``: a new install, or the quiet
  night after autovacuum found it empty), the workers start and idle, then the burst of
  ``burst`` jobs comes, all visible at one moment (asyncq: written to a paused queue, then
  resumed; plain SQL and PgQueuer: written in one transaction); the clock starts then;
- ``warm``: the burst is written and analyzed, then the workers start;
- ``backlog``: as warm, with ``backlog`` jobs (1,000,000 in a full run) queued when the
  workers start, all drained;
- ``history``: as warm, in a table that also holds ``finished`` finished jobs (5,000,000
  in a full run) not yet pruned. PgQueuer moves a finished job out of its queue table into
  ``pgqueuer_log``: its finished jobs are there.

In the pre-loaded states the workers start connected (and the clock with them) once the
jobs are written, analyzed (as autovacuum would), read once (which sets the rows' hint bits,
as the ANALYZE of the warm state did for the workers) and checkpointed. Autovacuum is off
for the tables meanwhile, so that no ANALYZE changes the plans halfway. In the pre-loaded
states the workers run in their drain mode and the clock stops when the last of them says
it has exited (nothing left to claim, every outcome written): nothing polls the queue
meanwhile. A poll of what is left would walk the ready index's entries of the jobs already
claimed, which no VACUUM removes during the drain, and charge asyncq and plain SQL (whose
tables it reads) for it where River (which counts in its own process) pays nothing. In the
empty state the workers serve, and the clock stops when a poll finds no job left.

River runs its own ``river bench`` (benchmarks/river.py) from the same states, with the
two hooks of benchmarks/river/build.sh: the harness prepares ``river_job`` (kept, not
truncated) and River's bench runs the same ANALYZE, read and CHECKPOINT after its insert
and before its client starts. River's bench cannot start its client before the burst: its
``empty`` state is the burst written onto an analyzed empty table and not analyzed again,
so that its client plans against the statistics of the empty table.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import connect, workers
from benchmarks.measure import POLL_INTERVAL, preload, tag_of, wait_until_done, worker_args
from benchmarks.river import INSERT_COMPLETED, River
from benchmarks.systems import Point, System

STATES = ("empty", "warm", "backlog", "history")
SYSTEMS = ("asyncq", "baseline", "sql", "pgqueuer")
QUEUE = "default"
# Workers connected, listening, their statements planned: idle.
SETTLE = 1.0
# Finished jobs, as each system leaves them (%(n)s rows).
ASYNCQ_FINISHED = """
INSERT INTO asyncq_jobs (task_name, args, status, attempts, locked_by, locked_at,
                         run_at, created_at, finished_at)
SELECT 'bench.noop', '{}', 'done', 1, 'history', t, t, t, t
  FROM (SELECT now() - interval '1 hour' + g * interval '1 millisecond' AS t
          FROM generate_series(1, %(n)s) AS g) AS s
"""
PGQUEUER_FINISHED = """
INSERT INTO pgqueuer_log (created, job_id, status, priority, entrypoint, aggregated)
SELECT now() - interval '1 hour' + g * interval '1 millisecond', g, 'successful', 0,
       'bench.noop', true
  FROM generate_series(1, %(n)s) AS g
"""
FINISHED = {
    "asyncq": ASYNCQ_FINISHED,
    "baseline": ASYNCQ_FINISHED,
    "sql": ASYNCQ_FINISHED,
    "pgqueuer": PGQUEUER_FINISHED,
}


@dataclass(frozen=True)
class Sizes:
    burst: int  # jobs of the empty, warm and history states
    backlog: int  # jobs queued in the backlog state
    finished: int  # finished jobs in the history state

    def jobs(self, state: str) -> int:
        return self.backlog if state == "backlog" else self.burst


def points(name: str, quick: bool) -> list[Point]:
    """asyncq's default configuration and its best (from the throughput sweep); the
    others' best."""
    if name in ("asyncq", "baseline"):
        return [Point(10, 0)] if quick else [Point(10, 0), Point(200, 100)]
    if name == "sql":
        return [Point(10, 100, variant="batched")]
    if name == "pgqueuer":
        # Its best only: at its default batch of 10 a backlog of 1,000,000 takes many minutes.
        return [Point(0, 100)]
    return []


def load() -> float:
    return os.getloadavg()[0]


async def _execute(dsn: str, *statements: str, n: int | None = None) -> None:
    async with await connect(dsn) as conn:
        for statement in statements:
            await conn.execute(statement, {"n": n} if n is not None else None)  # type: ignore[arg-type]


def _each(template: str, tables: tuple[str, ...]) -> list[str]:
    return [template.format(table) for table in tables]


class Hold:
    """Jobs written between entering and `release` become visible to the workers at once:
    asyncq's queue paused then resumed; the others' writes in one transaction."""

    def __init__(self, system: Any) -> None:
        self.system = system
        self.transaction: Any = None

    async def __aenter__(self) -> Hold:
        if hasattr(self.system, "app"):
            await self.system.app.pause(QUEUE)
        else:
            self.transaction = self.system.conn.transaction()
            await self.transaction.__aenter__()
        return self

    async def release(self) -> None:
        if self.transaction is None:
            await self.system.app.resume(QUEUE)
        else:
            transaction, self.transaction = self.transaction, None
            await transaction.__aexit__(None, None, None)

    async def __aexit__(self, *exc: object) -> None:
        if self.transaction is not None:
            await self.transaction.__aexit__(*exc)
        elif hasattr(self.system, "app"):
            await self.system.app.resume(QUEUE)


async def drain(
    system: System,
    point: Point,
    sizes: Sizes,
    log_dir: Path,
    state: str,
    *,
    wrapper: tuple[str, ...] = (),
    on_ready: Callable[[], Awaitable[None]] | None = None,
    autovacuum: bool = False,
) -> dict[str, Any]:
    """One drain from ``state``; the result as the throughput part's, with the state.

    ``wrapper`` runs the workers under a profiler (whose output is whole in the pre-loaded
    states, where the workers exit when the queue is empty; in the empty state it is
    stopped). ``on_ready`` runs when the table is in its state and the workers are ready,
    just before they (or, in the empty state, the burst) go: benchmarks/start_profile.py
    resets the server's statistics there. ``autovacuum`` leaves the server's autovacuum
    (and the tables' own settings of it) on through the drain, as in production."""
    jobs = sizes.jobs(state)
    tables = system.tables
    await system.reset()
    if not autovacuum:
        await _execute(system.dsn, *_each("ALTER TABLE {} SET (autovacuum_enabled = off)", tables))
    tag = f"{tag_of(system, point)}-{state}"
    loadavg = load()
    try:
        if state == "history":
            await _execute(system.dsn, FINISHED[system.name], n=sizes.finished)
        if state == "empty":
            await _execute(system.dsn, *_each("VACUUM ANALYZE {}", tables), "CHECKPOINT")
            async with workers(
                worker_args(system, point, "serve"),
                point.processes,
                log_dir,
                tag,
                wrapper,
                python=system.interpreter(),
            ) as procs:
                for proc in procs:
                    proc.go()
                await asyncio.sleep(SETTLE)
                if on_ready is not None:
                    await on_ready()
                before = await system.completed()  # the probe's connection, opened now
                async with Hold(system) as hold:
                    await preload(system, jobs)
                    started = time.perf_counter()
                    await hold.release()
                finished = await wait_until_done(
                    system, interval=POLL_INTERVAL, within=120 + jobs / 100
                )
        else:
            await preload(system, jobs)
            await _execute(
                system.dsn,
                *_each("ANALYZE {}", tables),
                *_each("SELECT count(*) FROM {}", tables),
                "CHECKPOINT",
            )
            async with workers(
                worker_args(system, point, "drain"),
                point.processes,
                log_dir,
                tag,
                wrapper,
                python=system.interpreter(),
            ) as procs:
                if on_ready is not None:
                    await on_ready()
                before = await system.completed()  # the probe's connection, opened now
                for proc in procs:
                    proc.go()
                started = time.perf_counter()
                within = 120 + jobs / 100
                finished = max([await proc.wait_drained(within) for proc in procs])
                if wrapper:  # a profiler writes its output when its worker exits
                    for proc in procs:
                        await proc.wait_exit(30)
        completed = await system.completed() - before
    finally:
        await system.close_probe()
        if not autovacuum:
            await _execute(system.dsn, *_each("ALTER TABLE {} RESET (autovacuum_enabled)", tables))
    seconds = finished - started
    return {
        "state": state,
        "jobs": jobs,
        "finished_rows": sizes.finished if state == "history" else 0,
        "seconds": seconds,
        "rate": jobs / seconds,
        "completed": completed,
        "ok": completed == jobs,
        "load": loadavg,
    }


# What River's bench runs after its insert, before its client starts, in the pre-loaded
# states (as the harness does for the other systems).
RIVER_SETTLE = "ANALYZE river_job; SELECT count(*) FROM river_job; CHECKPOINT"


async def river_drain(river: River, sizes: Sizes, state: str) -> dict[str, Any]:
    """``river bench`` from ``state``; River's own rate."""
    jobs = sizes.jobs(state)
    loadavg = load()
    await _execute(
        river.dsn, "TRUNCATE river_job", "ALTER TABLE river_job SET (autovacuum_enabled = off)"
    )
    try:
        if state == "history":
            await _execute(river.dsn, INSERT_COMPLETED, n=sizes.finished)
        if state == "empty":
            await _execute(river.dsn, "VACUUM ANALYZE river_job", "CHECKPOINT")
            settle = "SELECT count(*) FROM river_job; CHECKPOINT"
        else:
            settle = RIVER_SETTLE
        run = await river.bench(jobs, keep_table=True, before_start=settle, log=f"river-{state}")
    finally:
        await _execute(river.dsn, "ALTER TABLE river_job RESET (autovacuum_enabled)")
    run.update(
        state=state,
        finished_rows=sizes.finished if state == "history" else 0,
        load=loadavg,
    )
    return run
