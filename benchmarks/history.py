"""Does asyncq's claim stay cheap as finished rows pile up, and does a drain ever scan
the whole table?

EXPLAIN (ANALYZE, BUFFERS) of asyncq's claim (a batch of 100, rolled back) with a
backlog of queued jobs, in four tables:

- ``empty``: only the backlog;
- ``done rows, vacuumed``: the backlog plus N done rows, after VACUUM ANALYZE (what
  autovacuum leaves: the steady state);
- ``done by UPDATE, not vacuumed``: N jobs that were queued and then marked done in
  one go, autovacuum held off: their dead entries still sit in the ready index
  (the worst moment, right after a big drain);
- ``... then vacuumed``: the same after VACUUM ANALYZE.

Then ``pg_stat_user_tables.seq_scan`` of asyncq_jobs before and after an asyncq
worker drains a backlog on top of the N done rows.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg

from asyncq import App
from benchmarks.common import connect, recreate_database, workers
from benchmarks.measure import worker_args
from benchmarks.systems import Point
from benchmarks.systems.asyncq_system import AsyncqSystem

CLAIM_LIMIT = 100
EXPLAINS = 7

INSERT_QUEUED = """
INSERT INTO asyncq_jobs (task_name, args, run_at)
SELECT 'bench.noop', '{}', now() - interval '1 second' FROM generate_series(1, %(n)s)
"""
INSERT_DONE = """
INSERT INTO asyncq_jobs (task_name, args, status, attempts, locked_by, locked_at,
                         run_at, created_at, finished_at)
SELECT 'bench.noop', '{}', 'done', 1, 'history', t, t, t, t
  FROM (SELECT now() - interval '1 hour' + g * interval '1 millisecond' AS t
          FROM generate_series(1, %(n)s) AS g) AS s
"""
INSERT_QUEUED_OLD = """
INSERT INTO asyncq_jobs (task_name, args, run_at, created_at)
SELECT 'bench.noop', '{}', t, t
  FROM (SELECT now() - interval '1 hour' + g * interval '1 millisecond' AS t
          FROM generate_series(1, %(n)s) AS g) AS s
"""
MARK_ALL_DONE = """
UPDATE asyncq_jobs SET status = 'done', attempts = 1, locked_by = 'history',
       finished_at = now() WHERE status = 'queued'
"""
STATS = """
SELECT seq_scan, coalesce(idx_scan, 0), n_live_tup, n_dead_tup
  FROM pg_stat_user_tables WHERE relname = 'asyncq_jobs'
"""


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [node]
    for child in node.get("Plans", []):
        nodes.extend(_walk(child))
    return nodes


async def explain_claim(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """One claim under EXPLAIN (ANALYZE, BUFFERS), rolled back: the any-queue statement of
    the claim function (migration 0009), run as the function runs it, on a generic plan
    with the function's arguments as parameters (EXPLAIN of the function's call would
    show a function scan, not the plan inside)."""
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'asyncq_claim'")
        found = await cur.fetchone()
        assert found is not None, "no asyncq_claim function: migrate first"
        statement = str(found[0]).split("RETURN QUERY")[1].split(";")[0]
        for number, arg in enumerate(("p_worker", "p_limit", "p_lease", "p_queues", "p_skip"), 1):
            statement = re.sub(rf"\b{arg}\b", f"${number}", statement)
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(
            f"PREPARE asyncq_history_claim(text, int, interval, text[], text[]) AS {statement}"  # type: ignore[arg-type]
        )
        try:
            cur = await conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE asyncq_history_claim("  # type: ignore[arg-type]
                f"'explain', {CLAIM_LIMIT}, '30 seconds', NULL, NULL)"
            )
            row = await cur.fetchone()
        finally:
            await conn.execute("DEALLOCATE asyncq_history_claim")
    assert row is not None
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan = doc[0]
    top = plan["Plan"]
    nodes = _walk(top)
    return {
        "execution_ms": plan["Execution Time"],
        "planning_ms": plan["Planning Time"],
        "shared_hit": top.get("Shared Hit Blocks", 0),
        "shared_read": top.get("Shared Read Blocks", 0),
        "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
        "rows": top.get("Actual Rows", 0) or _claimed(nodes),
        "seq_scans": [
            n["Node Type"]
            for n in nodes
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "asyncq_jobs"
        ],
        "scans": sorted(
            {
                f"{n['Node Type']} {n.get('Index Name', '')}".strip()
                for n in nodes
                if "Scan" in n["Node Type"]
            }
        ),
    }


def _claimed(nodes: list[dict[str, Any]]) -> int:
    return max((int(n.get("Actual Rows", 0)) for n in nodes), default=0)


async def _measure(conn: psycopg.AsyncConnection[Any], case: str) -> dict[str, Any]:
    runs = [await explain_claim(conn) for _ in range(EXPLAINS)]
    first, rest = runs[0], runs[1:]
    return {
        "case": case,
        "first": first,
        "median_execution_ms": statistics.median(r["execution_ms"] for r in rest),
        "median_planning_ms": statistics.median(r["planning_ms"] for r in rest),
        "median_buffers": statistics.median(r["buffers"] for r in rest),
        "seq_scan_in_plan": any(r["seq_scans"] for r in runs),
        "scans": first["scans"],
    }


async def _vacuum(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("VACUUM ANALYZE asyncq_jobs")


async def _stats(dsn: str) -> tuple[int, int]:
    async with await connect(dsn) as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await (await conn.execute(STATS)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def run(
    admin_dsn: str, *, rows: int, backlog: int, drain_jobs: int, log_dir: Path
) -> dict[str, Any]:
    dsn = await recreate_database(admin_dsn, "history")
    async with App(dsn) as app:
        await app.migrate()
    cases: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    async with await connect(dsn) as conn:
        await conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")
        await conn.execute(INSERT_QUEUED, {"n": backlog})
        await _vacuum(conn)
        cases.append(await _measure(conn, "empty"))

        # Steady state: done rows that autovacuum has seen.
        await conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")
        started = time.perf_counter()
        await conn.execute(INSERT_DONE, {"n": rows})
        timings["insert_done_s"] = time.perf_counter() - started
        await conn.execute(INSERT_QUEUED, {"n": backlog})
        await _vacuum(conn)
        cases.append(await _measure(conn, "done rows, vacuumed"))

        # Worst moment: a big drain just happened, autovacuum has not run yet.
        await conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")
        await conn.execute("ALTER TABLE asyncq_jobs SET (autovacuum_enabled = false)")
        try:
            await conn.execute(INSERT_QUEUED_OLD, {"n": rows})
            await _vacuum(conn)
            started = time.perf_counter()
            await conn.execute(MARK_ALL_DONE)
            timings["update_to_done_s"] = time.perf_counter() - started
            await conn.execute(INSERT_QUEUED, {"n": backlog})
            cases.append(await _measure(conn, "done by UPDATE, not vacuumed"))
        finally:
            await conn.execute("ALTER TABLE asyncq_jobs RESET (autovacuum_enabled)")
        await _vacuum(conn)
        cases.append(await _measure(conn, "done by UPDATE, then vacuumed"))

        # A drain on top of the history: does anything scan the whole table?
        await conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")
        await conn.execute(INSERT_DONE, {"n": rows})
        await conn.execute(INSERT_QUEUED, {"n": drain_jobs})
        await _vacuum(conn)
    await asyncio.sleep(1.5)  # let this backend's statistics reach the shared counters
    seq_before, idx_before = await _stats(dsn)
    system = AsyncqSystem(dsn)
    point = Point(100, 100)
    async with workers(worker_args(system, point, "drain"), 1, log_dir, "history-drain") as procs:
        procs[0].go()
        started = time.perf_counter()
        code = await procs[0].wait_exit(120 + drain_jobs / 100)
        drain_seconds = time.perf_counter() - started
    await asyncio.sleep(1.5)
    seq_after, idx_after = await _stats(dsn)
    async with await connect(dsn) as conn:
        row = await (await conn.execute(AsyncqSystem.completed_sql)).fetchone()
    done = int(row[0]) if row else 0

    empty = cases[0]
    for case in cases:
        case["time_ratio"] = case["median_execution_ms"] / empty["median_execution_ms"]
        case["buffer_ratio"] = case["median_buffers"] / max(empty["median_buffers"], 1)
        case["first_time_ratio"] = case["first"]["execution_ms"] / empty["median_execution_ms"]
    return {
        "rows": rows,
        "backlog": backlog,
        "claim_limit": CLAIM_LIMIT,
        "cases": cases,
        "timings": timings,
        "drain": {
            "jobs": drain_jobs,
            "history_rows": rows,
            "point": point.label,
            "seconds_to_exit": drain_seconds,
            "rate_to_exit": drain_jobs / drain_seconds,
            "exit_code": code,
            "completed": done - rows,
            "seq_scan_delta": seq_after - seq_before,
            "idx_scan_delta": idx_after - idx_before,
        },
    }
