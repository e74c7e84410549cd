"""A worker's memory across many jobs: one asyncq worker (serve mode) fed with no-op
jobs by ``defer_many`` while it runs, its RSS sampled from /proc once a second."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks.common import connect, recreate_database, rss_bytes, workers
from benchmarks.measure import worker_args
from benchmarks.systems import Point
from benchmarks.systems.asyncq_system import NOOP, AsyncqSystem

CHUNK = 10_000
BACKLOG_LOW = 50_000
BACKLOG_HIGH = 100_000
MB = 1024 * 1024


def _slope_mb_per_100k(samples: list[dict[str, Any]]) -> float | None:
    """Least-squares slope of RSS against jobs done, in MB per 100,000 jobs."""
    if len(samples) < 3:
        return None
    xs = [s["done"] for s in samples]
    ys = [s["rss_mb"] for s in samples]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return None
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return float(cov / var * 100_000)


async def run(admin_dsn: str, *, total: int, point: Point, log_dir: Path) -> dict[str, Any]:
    dsn = await recreate_database(admin_dsn, "memory")
    system = AsyncqSystem(dsn)
    await system.install()
    task = system.app.tasks[NOOP]
    samples: list[dict[str, Any]] = []
    deferred = 0
    async with system.app, await connect(dsn) as conn:
        while deferred < min(BACKLOG_HIGH, total):
            await task.defer_many([{}] * CHUNK)
            deferred += CHUNK
        args = worker_args(system, point, "serve")
        async with workers(args, 1, log_dir, "memory") as (proc,):
            pid = proc.proc.pid
            proc.go()
            started = time.perf_counter()
            next_sample = started
            done = 0
            while done < total:
                now = time.perf_counter()
                row = await (
                    await conn.execute(
                        "SELECT count(*) FROM asyncq_jobs WHERE status IN ('queued', 'running')"
                    )
                ).fetchone()
                pending = int(row[0]) if row else 0
                done = deferred - pending
                if now >= next_sample:
                    rss = rss_bytes(pid)
                    if rss is not None:
                        samples.append(
                            {"t": round(now - started, 2), "done": done, "rss_mb": rss / MB}
                        )
                    next_sample += 1.0
                if deferred < total and pending < BACKLOG_LOW:
                    while deferred < total and pending < BACKLOG_HIGH:
                        chunk = min(CHUNK, total - deferred)
                        await task.defer_many([{}] * chunk)
                        deferred += chunk
                        pending += chunk
                else:
                    await asyncio.sleep(0.2)
            seconds = time.perf_counter() - started
            rss = rss_bytes(pid)
            if rss is not None:
                samples.append({"t": round(seconds, 2), "done": done, "rss_mb": rss / MB})
    warm = next((s for s in samples if s["done"] >= total * 0.1), samples[0])
    later = [s for s in samples if s["done"] >= warm["done"]]
    return {
        "jobs": total,
        "point": point.label,
        "seconds": seconds,
        "rate": total / seconds,
        "rss_start_mb": samples[0]["rss_mb"],
        "rss_warm_mb": warm["rss_mb"],
        "rss_end_mb": samples[-1]["rss_mb"],
        "rss_max_mb": max(s["rss_mb"] for s in samples),
        "growth_after_warm_mb": samples[-1]["rss_mb"] - warm["rss_mb"],
        "slope_mb_per_100k_jobs": _slope_mb_per_100k(later),
        "samples": samples,
    }
