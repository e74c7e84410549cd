"""The aged claim (priority aging): it takes the lower-priority jobs whose priority, raised
a level for every ``aging`` seconds they have been due, is above that of the top
priority's oldest job, best first, and nothing else; it keeps to the worker's queues,
skips paused queues and the tasks it is told to skip, and writes no waiting row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq import admin
from tests.harness.jobs import insert_jobs

pytestmark = pytest.mark.anyio
Db = psycopg.Connection[Any]
LEASE = timedelta(seconds=30)


def due_ago(db: Db, task: str, priority: int, seconds: float, queue: str = "default") -> int:
    (job_id,) = insert_jobs(db, task, [{}], priority=priority, queue=queue)
    db.execute(
        "UPDATE asyncq_jobs SET run_at = now() - make_interval(secs => %s) WHERE id = %s",
        (seconds, job_id),
    )
    return job_id


async def claim(app: asyncq.App, aconn: Any, **options: Any) -> list[int]:
    params: dict[str, Any] = {"queues": None, "aging": 5.0, "limit": 10, **options}
    jobs = await app.store.claim_aged(aconn, worker="w", lease=LEASE, **params)
    return [job.id for job in jobs]


async def test_only_jobs_aged_past_the_top_priority_are_claimed_best_first(
    app: asyncq.App, db: Db, aconn: Any
) -> None:
    insert_jobs(db, "t", [{}] * 50, priority=10)  # due now: effective 10
    low_old = due_ago(db, "t", 0, 60)  # 0 + 60 / 5 = 12
    mid_old = due_ago(db, "t", 5, 40)  # 5 + 40 / 5 = 13
    due_ago(db, "t", 0, 20)  # 4: stays behind
    due_ago(db, "t", 5, 10)  # 7: stays behind

    assert await claim(app, aconn) == [mid_old, low_old]
    assert await claim(app, aconn) == []  # the rest stay for the plain claim
    assert await claim(app, aconn, aging=1.0) != []  # with a shorter level, they pass too
    row = db.execute(
        "SELECT count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE"
        " status = 'queued' AND priority = 10) FROM asyncq_jobs"
    ).fetchone()
    assert row == (4, 50)


async def test_a_claim_of_one_priority_or_of_none_takes_nothing(
    app: asyncq.App, db: Db, aconn: Any
) -> None:
    assert await claim(app, aconn) == []
    due_ago(db, "t", 3, 3600)
    assert await claim(app, aconn) == []  # the top priority's own: the plain claim's


async def test_queues_paused_queues_and_skipped_tasks(app: asyncq.App, db: Db, aconn: Any) -> None:
    insert_jobs(db, "t", [{}], priority=10, queue="a")
    insert_jobs(db, "t", [{}], priority=10, queue="b")
    in_a = due_ago(db, "t", 0, 600, queue="a")
    in_b = due_ago(db, "t", 0, 600, queue="b")
    skipped = due_ago(db, "unknown", 0, 600, queue="a")

    assert await app.pause("b")
    assert await claim(app, aconn, queues=["b"]) == []
    assert await claim(app, aconn, skip=["unknown"]) == [in_a]
    assert await app.resume("b")
    assert await claim(app, aconn, queues=["b"]) == [in_b]
    assert await claim(app, aconn, queues=["a"]) == [skipped]


async def test_asyncq_job_shows_the_effective_priority_the_aged_claim_orders_by(
    app: asyncq.App, db: Db, aconn: Any
) -> None:
    insert_jobs(db, "t", [{}], priority=10)
    aged = due_ago(db, "t", 0, 62)  # 0 + 62 // 5 = 12: above the top's 10
    young = due_ago(db, "t", 0, 9)  # 1

    async def effective(job_id: int, **aging: float) -> int | None:
        found = await admin.job(aconn, app.store, job_id, **aging)
        assert found is not None
        return found.effective_priority

    assert await effective(aged) == 12
    assert await effective(aged, priority_aging=0) is None
    assert await effective(young) == 1

    assert await claim(app, aconn) == [aged]
    assert await effective(aged) is None  # only while queued
