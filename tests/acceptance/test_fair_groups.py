"""Jobs deferred in groups are claimed round-robin over the groups across worker processes:
behind a backlog of 20,000 jobs of one group, the first job of another group starts
within the next claim. Counted, not timed: the jobs of the backlog that started after the
new group's job was deferred and before it started number no more than the claims out
then could take (each worker claims for its free runners, `CONCURRENCY`)."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg

import asyncq
from tests.harness.fair_app import APP, TENANT_JOB
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

Db = psycopg.Connection[Any]
BACKLOG = 20_000
CONCURRENCY = 4
WORKERS = 2


def defer(dsn: str, group: str, count: int) -> list[int]:
    """Defer ``count`` jobs in ``group`` as an App does (options(group=...).defer_many)."""

    async def main() -> list[int]:
        async with asyncq.App(dsn) as app:

            @app.task(name=TENANT_JOB)
            async def tenant_job(ms: int) -> None: ...

            return await tenant_job.options(group=group).defer_many([{"ms": 10}] * count)

    return anyio.run(main)


def started(db: Db, group: str) -> int:
    row = db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE group_key = %s AND started_at IS NOT NULL",
        (group,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_new_group_s_first_job_starts_within_a_claim_behind_another_s_backlog(
    db: Db, workers: Workers, dsn: str
) -> None:
    defer(dsn, "acme", BACKLOG)
    procs = [
        workers.start("--concurrency", str(CONCURRENCY), app=APP, lease=30) for _ in range(WORKERS)
    ]
    wait_until(lambda: started(db, "acme") >= 200, 30, "the backlog to be under way")

    before = started(db, "acme")  # counted before the defer: any claim since counts after
    [first] = defer(dsn, "globex", 1)
    wait_until(
        lambda: db.execute("SELECT started_at FROM asyncq_jobs WHERE id = %s", (first,)).fetchone()[
            0
        ],
        30,
        "the new group's job to start",
    )
    row = db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE group_key = 'acme'"
        " AND started_at < (SELECT started_at FROM asyncq_jobs WHERE id = %s)",
        (first,),
    ).fetchone()
    assert row is not None
    ahead = row[0] - before
    # At most the claims out as it was deferred, and the next one, on every worker.
    assert ahead <= 2 * WORKERS * CONCURRENCY, ahead
    assert started(db, "acme") < BACKLOG // 2  # the backlog was still there

    assert set(workers.stop_all().values()) == {0}
    # The test's schema has no asyncq_jobs_ready_by_task (no App with limits migrated it).
    for proc in procs:
        assert "are deferred in groups, but" in proc.stderr(), proc.stderr()
    assert not workers.tracebacks(), workers.tracebacks()
