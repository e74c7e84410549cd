"""The claim (a function, see migration 0009) reads the ready index in order and stops
at its LIMIT: it never sorts the backlog (only the rows it claimed, back into the order it
chose them in), with queues paused or not (a filter the planner misjudges turns a claim
of 100 rows out of 20,000 ready ones into a sort of all 20,000). Its plans are generic:
the LIMIT is a parameter the planner cannot see."""

from __future__ import annotations

import re
from typing import Any

import pytest

import asyncq

pytestmark = pytest.mark.anyio


async def plans(app: asyncq.App) -> dict[str, str]:
    """The plans of the claim function's two statements (any queue, some queues), as the
    function runs them: its settings (search path, generic plans), its arguments as
    parameters."""
    name = f"{app.store.schema}.asyncq_claim" if app.store.schema else "asyncq_claim"
    found = {}
    async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
        cur = await conn.execute(
            "SELECT prosrc, proconfig FROM pg_proc WHERE oid = %s::regproc", [name]
        )
        source, settings = await cur.fetchone()  # type: ignore[misc]
        for setting in settings:
            key, _, value = setting.partition("=")
            await conn.execute(f"SELECT set_config('{key}', %s, true)", [value])
        statements = [part.split(";")[0] for part in source.split("RETURN QUERY")[1:]]
        for branch, statement in zip(("claim_any", "claim_queues"), statements, strict=True):
            for number, arg in enumerate(("p_worker", "p_limit", "p_lease", "p_queues"), 1):
                statement = re.sub(rf"\b{arg}\b", f"${number}", statement)
            await conn.execute(
                f"PREPARE {branch}(text, int, interval, text[]) AS {statement}"  # type: ignore[arg-type]
            )
            cur = await conn.execute(
                f"EXPLAIN (COSTS OFF) EXECUTE {branch}('w', 100, '30 s', '{{default}}')"  # type: ignore[arg-type]
            )
            found[branch] = "\n".join(str(row[0]) for row in await cur.fetchall())
            await conn.execute(f"DEALLOCATE {branch}")  # type: ignore[arg-type]
    return found


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
        for query, found in (await plans(app)).items():
            # One sort only: of the claimed rows, at most the LIMIT, into the order chosen.
            keys = [line.strip() for line in found.splitlines() if "Sort Key" in line]
            assert keys == ["Sort Key: c.priority DESC, c.run_at, c.id"], (
                f"{query} (paused: {paused}) sorts:\n{found}"
            )
            assert "asyncq_jobs_ready" in found, found
