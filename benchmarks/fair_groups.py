"""The claim of a task deferred in groups: one group against 10,000, same backlog.

``python -m benchmarks.fair_groups --dsn DSN [--rounds 2] [--jobs 20000] [--claims 60]``

Each round empties the jobs table of DSN (a database of its own: it is truncated),
defers ``--jobs`` jobs of one task in one group, or spread over 10,000 groups, and
times ``--claims`` limited claims of 10 on one connection, as a worker makes them (the
task named among the limited ones, as the limiter names a task deferred in groups). It
prints the median of each round, the first 10 claims left out. The schema is migrated
with a limited task, so that ``asyncq_jobs_ready_by_task`` exists.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import timedelta

import psycopg

import asyncq
from asyncq.limits import ClaimLimits, TaskLimits

TASK = "bench.fair"


async def claim_times(dsn: str, groups: int, jobs: int, claims: int) -> float:
    """The median milliseconds of a claim of 10 behind ``jobs`` jobs in ``groups`` groups."""
    async with asyncq.App(dsn) as app:

        @app.task(name=TASK)
        async def fair(n: int) -> None: ...

        @app.task(name="bench.capped", concurrency=1)
        async def capped() -> None: ...

        await app.migrate()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE asyncq_jobs, asyncq_fair_tasks, asyncq_group_turns")
            for g in range(groups):
                await fair.options(group=f"g{g}").defer_many(
                    [{"n": i} for i in range(jobs // groups)]
                )
            await conn.execute("VACUUM ANALYZE asyncq_jobs")
            limits = ClaimLimits.of([(TASK, TaskLimits())], fair=[TASK])
            assert limits is not None
            took = []
            for _ in range(claims):
                began = time.perf_counter()
                claimed = await app.store.claim_limited(
                    conn,
                    worker="bench",
                    limit=10,
                    queues=None,
                    lease=timedelta(seconds=300),
                    limits=limits,
                    limited=10,
                )
                took.append(time.perf_counter() - began)
                assert len(claimed) == 10
    return statistics.median(took[10:]) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fair_groups")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--claims", type=int, default=60)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for groups in (1, 10_000):
            ms = await claim_times(args.dsn, groups, args.jobs, args.claims)
            print(f"{groups:>6} groups, {args.jobs} jobs: claim of 10, median {ms:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
