"""Where asyncq's time goes from a start state: one drain with the server's statistics per
statement (``pg_stat_statements``), then one more under py-spy (the worker's functions).

The table is put in its state as the ``starts`` part does (benchmarks/starts.py); the
statistics are reset when the workers are ready, so that they hold the drain's statements
only (in the empty state also the harness's probe of what is left, every 10 ms). asyncq
sends one statement per round trip (no pipelining), so the calls per job are its round
trips per job. ``--autovacuum`` leaves autovacuum on for the table through the drains (as
in production), ``--table-setting`` changes its storage settings first, ``--repeats``
drains that many times (the statements are the last drain's).

pg_stat_statements must be preloaded (``shared_preload_libraries``; with
``pg_stat_statements.track_planning = on`` the planning time is counted too): a server of
its own if the shared one has it off, e.g.::

    initdb -D /tmp/pgq -A trust -U postgres  # then in postgresql.conf: port = 5498,
    # shared_preload_libraries = 'pg_stat_statements', pg_stat_statements.track_planning = on
    python -m benchmarks.start_profile --dsn postgresql://postgres@127.0.0.1:5498/postgres \\
        --state backlog --jobs 200000 --concurrency 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from benchmarks import profile
from benchmarks.common import connect, median, recreate_database
from benchmarks.starts import STATES, Sizes, drain
from benchmarks.systems import Point, System, load

STATEMENTS = """
SELECT query, calls, rows, total_exec_time, total_plan_time, shared_blks_hit,
       shared_blks_read, shared_blks_dirtied, wal_bytes
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND query NOT LIKE '%pg_stat_statements%'
 ORDER BY total_exec_time + total_plan_time DESC
"""


# Blocks and index entries per relation (the table, its TOAST, each index).
RELATIONS = """
SELECT s.relname AS relation, s.heap_blks_hit + s.heap_blks_read AS blocks,
       s.heap_blks_read AS read, NULL::bigint AS scans, NULL::bigint AS entries
  FROM pg_statio_user_tables s WHERE s.relname = 'asyncq_jobs'
UNION ALL
SELECT i.indexrelname, i.idx_blks_hit + i.idx_blks_read, i.idx_blks_read, u.idx_scan,
       u.idx_tup_read
  FROM pg_statio_user_indexes i JOIN pg_stat_user_indexes u USING (indexrelid)
 WHERE i.relname = 'asyncq_jobs'
 ORDER BY 2 DESC
"""


# Autovacuum's visits to the table since the statistics were reset (the drain's).
AUTOVACUUMS = """
SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables WHERE relname = 'asyncq_jobs'
"""


async def _reset(dsn: str) -> None:
    async with await connect(dsn) as conn:
        await conn.execute("SELECT pg_stat_statements_reset(), pg_stat_reset()")


async def _statements(dsn: str) -> list[dict[str, Any]]:
    async with await connect(dsn) as conn:
        cur = await conn.execute(STATEMENTS)
        names = [column.name for column in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]


async def _autovacuums(dsn: str) -> dict[str, int]:
    async with await connect(dsn) as conn:
        row = await (await conn.execute(AUTOVACUUMS)).fetchone()
    vacuums, analyzes = row or (0, 0)
    return {"autovacuums": vacuums, "autoanalyzes": analyzes}


async def _relations(dsn: str, jobs: int) -> list[dict[str, Any]]:
    """Per relation of asyncq_jobs: blocks, blocks read from outside shared buffers, index
    scans and index entries read, per job."""
    async with await connect(dsn) as conn:
        rows = await (await conn.execute(RELATIONS)).fetchall()
    return [
        {
            "relation": name,
            "blocks_per_job": blocks / jobs,
            "read_per_job": read / jobs,
            "scans_per_job": None if scans is None else scans / jobs,
            "entries_per_scan": None if not scans else entries / scans,
        }
        for name, blocks, read, scans, entries in rows
    ]


def per_job(statements: list[dict[str, Any]], jobs: int, seconds: float) -> dict[str, Any]:
    """Calls, rows and server time per job of each statement, and their sums."""
    server_ms = sum(s["total_exec_time"] + s["total_plan_time"] for s in statements)
    rows = [
        {
            "query": " ".join(s["query"].split())[:160],
            "calls_per_job": s["calls"] / jobs,
            "rows_per_call": s["rows"] / s["calls"] if s["calls"] else 0.0,
            "exec_us_per_job": 1000 * s["total_exec_time"] / jobs,
            "plan_us_per_job": 1000 * s["total_plan_time"] / jobs,
            "share": (s["total_exec_time"] + s["total_plan_time"]) / server_ms if server_ms else 0,
            "blocks_per_job": (s["shared_blks_hit"] + s["shared_blks_read"]) / jobs,
            "read_per_job": s["shared_blks_read"] / jobs,
            "wal_bytes_per_job": float(s["wal_bytes"]) / jobs,
        }
        for s in statements
    ]
    return {
        "round_trips_per_job": sum(s["calls"] for s in statements) / jobs,
        "server_us_per_job": 1000 * server_ms / jobs,
        # the statements' time over the drain's: > 1 where statements ran side by side
        "server_busy": server_ms / 1000 / seconds,
        "statements": rows,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    dsn = await recreate_database(args.dsn, "asyncq")
    async with await connect(dsn) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    system: System = load("asyncq").SYSTEM(dsn)
    await system.install()
    await system.open()
    point = Point(args.concurrency, args.batch)
    sizes = Sizes(burst=args.jobs, backlog=args.jobs, finished=args.finished_jobs)
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    settings = ", ".join(args.table_setting)
    try:
        if settings:
            async with await connect(dsn) as conn:
                await conn.execute(f"ALTER TABLE asyncq_jobs SET ({settings})")
        drains = []
        for _ in range(args.repeats):
            run = await drain(
                system,
                point,
                sizes,
                log_dir,
                args.state,
                on_ready=lambda: _reset(dsn),
                autovacuum=args.autovacuum,
            )
            drains.append({**run, **await _autovacuums(dsn)})
        result: dict[str, Any] = {
            "state": args.state,
            "point": point.label,
            "autovacuum": args.autovacuum,
            "table_settings": settings,
            "drains": drains,
            "median_rate": median([d["rate"] for d in drains]),
            "drain": run,
            "load": os.getloadavg(),
            **per_job(await _statements(dsn), run["jobs"], run["seconds"]),
            "relations": await _relations(dsn, run["jobs"]),
        }
        spy = profile.py_spy() if args.py_spy else None
        if spy is not None:
            raw = args.out / f"asyncq-{args.state}-profile.txt"
            wrapper: tuple[str, ...] = (spy, "record", "--nonblocking", "--rate", str(profile.RATE))
            wrapper += ("--format", "raw", "-o", str(raw), "--")
            spied = await drain(system, point, sizes, log_dir, args.state, wrapper=wrapper)
            result["profile"] = profile.rank(raw, top=20)
            result["profile"]["rate_under_profiler"] = spied["rate"]
            seconds = spied["seconds"] * profile.RATE
            result["profile"]["busy_share"] = result["profile"]["samples"] / seconds
    finally:
        await system.close()
    return result


def render(result: dict[str, Any]) -> str:
    run = result["drain"]
    drains = result.get("drains", [run])
    lines = [
        "drains: "
        + "; ".join(
            f"{d['rate']:,.0f} jobs/s (load {d['load']:.1f},"
            f" {d.get('autovacuums', 0)} autovacuums, {d.get('autoanalyzes', 0)} autoanalyzes)"
            for d in drains
        )
        + f"; median {result.get('median_rate', run['rate']):,.0f}"
        + (
            " (autovacuum on"
            + (f"; {result['table_settings']}" if result.get("table_settings") else "")
            + ")"
            if result.get("autovacuum")
            else ""
        ),
        "the last drain's statements:",
        f"asyncq {result['point']} from {result['state']} ({run['jobs']:,} jobs):"
        f" {run['rate']:,.0f} jobs/s, load {run['load']:.1f};"
        f" {result['round_trips_per_job']:.3f} round trips per job,"
        f" {result['server_us_per_job']:.1f} us of statements per job"
        f" (server busy {result['server_busy']:.2f}x the drain's time)",
        "  calls/job  rows/call  exec us/job  plan us/job  share  blocks/job  read/job"
        "  WAL B/job  statement",
    ]
    for s in result["statements"]:
        if s["share"] < 0.001 and s["calls_per_job"] < 0.001:
            continue
        lines.append(
            f"  {s['calls_per_job']:9.4f}  {s['rows_per_call']:9.1f}  {s['exec_us_per_job']:11.2f}"
            f"  {s['plan_us_per_job']:11.2f}  {s['share']:5.1%}  {s['blocks_per_job']:10.2f}"
            f"  {s['read_per_job']:8.2f}  {s['wal_bytes_per_job']:9.1f}  {s['query']}"
        )
    lines.append("  blocks/job  read/job  scans/job  entries/scan  relation")
    for r in result.get("relations", []):
        scans = "" if r["scans_per_job"] is None else f"{r['scans_per_job']:.4f}"
        entries = "" if r["entries_per_scan"] is None else f"{r['entries_per_scan']:.1f}"
        lines.append(
            f"  {r['blocks_per_job']:10.2f}  {r['read_per_job']:8.2f}  {scans:>9}"
            f"  {entries:>12}  {r['relation']}"
        )
    spied = result.get("profile")
    if spied:
        lines.append(
            f"worker under py-spy: {spied['rate_under_profiler']:,.0f} jobs/s, busy"
            f" {spied['busy_share']:.0%} of the drain; most samples running (self):"
        )
        lines += [f"  {row['share']:6.1%}  {row['function']}" for row in spied["self"]]
        lines.append("most samples on the stack (total):")
        lines += [f"  {row['share']:6.1%}  {row['function']}" for row in spied["total"]]
    return "\n".join(lines)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.start_profile")
    parser.add_argument("--dsn", required=True, help="a server with pg_stat_statements preloaded")
    parser.add_argument("--state", choices=STATES, default="backlog")
    parser.add_argument("--jobs", type=int, default=200_000, help="jobs drained")
    parser.add_argument("--finished-jobs", type=int, default=1_000_000, help="history state")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=0, help="0: the worker's own")
    parser.add_argument("--repeats", type=int, default=1, help="drains with statistics")
    parser.add_argument(
        "--autovacuum",
        action="store_true",
        help="leave autovacuum on for asyncq_jobs through the drains (the server's setting)",
    )
    parser.add_argument(
        "--table-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a storage setting of asyncq_jobs for the drains, e.g."
        " autovacuum_vacuum_scale_factor=0 (repeatable)",
    )
    parser.add_argument(
        "--py-spy", action=argparse.BooleanOptionalAction, default=True, help="the second drain"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/start_profile"))
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    arguments.out.mkdir(parents=True, exist_ok=True)
    found = asyncio.run(main(arguments))
    path = arguments.out / f"{found['state']}-{found['point'].replace(' ', '_')}.json"
    path.write_text(json.dumps(found, indent=1, default=str))
    print(render(found))
    print(f"results: {path}")
