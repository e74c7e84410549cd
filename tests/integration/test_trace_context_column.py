"""The ``trace_context`` column (migration 0008), at the store: every insert writes the
context it is given and names the column only then; the claims return it (the claim of
limited tasks, for a traced App's store only)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

import asyncq
from asyncq.limits import ClaimLimits, TaskLimits
from asyncq.store import NewJob, Store

pytestmark = pytest.mark.anyio

CONTEXT = json.dumps({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})


def new_job(trace_context: str | None, **fields: Any) -> NewJob:
    job = NewJob("t.traced", "q", '{"n": 1}', 0, None, 0.0, 3, trace_context=trace_context)
    return job._replace(**fields)


async def test_each_insert_writes_the_context_it_is_given(app: asyncq.App, db: Any) -> None:
    store, traced = Store(), Store(traced=True)
    async with app.pool.connection() as conn:
        written = {
            "now": [await store.insert_job(conn, new_job(CONTEXT))],
            "later": [await store.insert_job(conn, new_job(CONTEXT, delay=60.0))],
            "unique": [await store.insert_job(conn, new_job(CONTEXT), unique_key="k")],
            "grouped": [await store.insert_job(conn, new_job(CONTEXT, group_key="g"))],
            "many": await store.insert_jobs(conn, new_job(CONTEXT, args='[{"n": 1}, {"n": 2}]')),
            "many grouped": await store.insert_jobs(
                conn, new_job(CONTEXT, args='[{"n": 1}]', group_key="g")
            ),
            "rows": await traced.insert_rows(conn, rows=[new_job(CONTEXT), new_job(None)]),
            "plain": [
                await store.insert_job(conn, new_job(None)),
                await store.insert_job(conn, new_job(None), unique_key="other"),
                *await store.insert_rows(conn, rows=[new_job(None), new_job(None)]),
                *await store.insert_jobs(conn, new_job(None, args='[{"n": 1}]')),
            ],
        }
        # A taken unique key writes nothing and returns the live job, context or not.
        assert (
            await store.insert_job(conn, new_job(CONTEXT), unique_key="k") == written["unique"][0]
        )
    rows = dict(db.execute("SELECT id, trace_context FROM asyncq_jobs").fetchall())
    assert len(rows) == sum(len(ids) for ids in written.values())
    traced = [i for form, ids in written.items() if form != "plain" for i in ids]
    untraced_row = written["rows"][1]
    for job_id in traced:
        expected = None if job_id == untraced_row else json.loads(CONTEXT)
        assert rows[job_id] == expected, job_id
    assert all(rows[job_id] is None for job_id in written["plain"])
    assert db.execute("SELECT count(*) FROM asyncq_jobs WHERE group_key = 'g'").fetchone() == (2,)


async def test_the_claims_return_the_context(app: asyncq.App) -> None:
    lease = timedelta(seconds=30)
    one_at_a_time = TaskLimits.declared(concurrency=1, rate_limit=None, group_concurrency=None)
    limits = ClaimLimits.of([("t.limited", one_at_a_time)])
    plain, traced = Store(), Store(traced=True)
    limited = new_job(CONTEXT, task_name="t.limited", queue="limited")
    async with app.pool.connection() as conn:
        ids = {
            "any": await plain.insert_job(conn, new_job(CONTEXT)),
            "queues": await plain.insert_job(conn, new_job(CONTEXT, queue="named")),
            "limited": await plain.insert_job(conn, limited),
            "limited, untraced store": await plain.insert_job(conn, limited),
            "none": await plain.insert_job(conn, new_job(None)),
        }
        claimed = await plain.claim(conn, worker="w", limit=1, queues=["named"], lease=lease)
        for store in (traced, plain):  # one limited job each (concurrency=1), in id order
            claimed += await store.claim_limited(
                conn,
                worker="w",
                limit=10,
                queues=["limited"],
                lease=lease,
                limits=limits,
                limited=10,
            )
            await conn.execute(
                "UPDATE asyncq_jobs SET status = 'done', expires_at = NULL WHERE id = %s",
                (claimed[-1].id,),
            )
        claimed += await plain.claim(conn, worker="w", limit=10, queues=None, lease=lease)
    contexts = {job.id: job.trace_context for job in claimed}
    assert set(contexts) == set(ids.values()) and len(claimed) == len(ids)
    for form in ("any", "queues", "limited"):
        assert json.loads(contexts[ids[form]] or "null") == json.loads(CONTEXT), form
    # The store of an App without tracing does not look it up for the limited claim.
    assert contexts[ids["limited, untraced store"]] is None
    assert contexts[ids["none"]] is None
