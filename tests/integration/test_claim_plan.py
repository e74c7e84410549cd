"""The claim reads the ready index in order and stops at its LIMIT: it never sorts the
backlog (only the rows it claimed, back into the order it chose them in), with queues
paused or not (a filter the planner misjudges turns a claim of 100 rows out of 20,000
ready ones into a sort of all 20,000)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import asyncq

pytestmark = pytest.mark.anyio


async def plan(app: asyncq.App, query: str) -> str:
    async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
        cur = await conn.execute(
            "EXPLAIN (COSTS OFF) " + app.store.q[query],
            {"worker": "w", "limit": 100, "lease": timedelta(seconds=30), "queues": ["default"]},
        )
        return "\n".join(str(row[0]) for row in await cur.fetchall())


async def test_the_claim_never_sorts_the_backlog(app: asyncq.App, db: Any) -> None:
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, queue)"
        " SELECT 't', CASE WHEN g % 5 = 0 THEN 'queued' ELSE 'done' END::asyncq_job_status,"
        "        CASE WHEN g % 2 = 0 THEN 'default' ELSE 'other' END"
        " FROM generate_series(1, 100000) AS g"
    )
    db.execute("ANALYZE asyncq_jobs")
    for paused in (False, True):
        if paused:
            await app.pause("other")
        for query in ("claim_any", "claim_queues"):
            found = await plan(app, query)
            # One sort only: of the claimed rows, at most the LIMIT, into the order chosen.
            keys = [line.strip() for line in found.splitlines() if "Sort Key" in line]
            assert keys == ["Sort Key: claimed.priority DESC, claimed.run_at, claimed.id"], (
                f"{query} (paused: {paused}) sorts:\n{found}"
            )
            assert "asyncq_jobs_ready" in found, found
