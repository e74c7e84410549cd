"""Turns of grouped jobs: what each grouped defer gives its jobs, and the limited claim
taking a task's grouped jobs by them, round-robin over the groups, moving the task's
served turn forward (migration 0025)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import asyncq
from asyncq import pools
from asyncq.limits import ClaimLimits, TaskLimits

pytestmark = pytest.mark.anyio


async def claim(app: asyncq.App, names: list[str], limit: int) -> list[int]:
    limits = ClaimLimits.of([(n, TaskLimits()) for n in names], fair=names)
    assert limits is not None
    async with pools.connection(app.pool) as conn:
        jobs = await app.store.claim_limited(
            conn,
            worker="w",
            limit=limit,
            queues=None,
            lease=timedelta(seconds=30),
            limits=limits,
            limited=limit,
        )
    return sorted(job.id for job in jobs)


async def test_grouped_jobs_take_turns_and_are_claimed_round_robin(
    app: asyncq.App, db: Any
) -> None:
    @app.task
    async def work(n: int = 0) -> None:
        pass

    backlog = await work.options(group="acme").defer_many([{"n": n} for n in range(100)])
    assert db.execute("SELECT served FROM asyncq_fair_tasks").fetchall() == [(0,)]
    turns = dict(db.execute("SELECT id, turn FROM asyncq_jobs").fetchall())
    assert [turns[i] for i in backlog] == list(range(1, 101))

    assert await claim(app, [work.name], 3) == backlog[:3]
    assert db.execute("SELECT served FROM asyncq_fair_tasks").fetchall() == [(3,)]

    # A new group starts at the turn being served: ahead of the backlog's rest.
    first = await work.options(group="globex").defer(n=0)
    second = await work.options(group="globex").defer(n=1)
    (turn,) = db.execute("SELECT turn FROM asyncq_jobs WHERE id = %s", (first,)).fetchone()
    assert turn == 4
    assert await claim(app, [work.name], 2) == sorted([backlog[3], first])
    assert await claim(app, [work.name], 2) == sorted([backlog[4], second])
    assert await claim(app, [work.name], 2) == backlog[5:7]


async def test_a_task_not_deferred_in_groups_is_claimed_as_before(app: asyncq.App, db: Any) -> None:
    @app.task
    async def plain(n: int = 0) -> None:
        pass

    ids = await plain.defer_many([{"n": n} for n in range(5)])
    assert db.execute("SELECT count(*) FROM asyncq_fair_tasks").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM asyncq_jobs WHERE turn IS NOT NULL").fetchone() == (0,)
    assert await claim(app, [plain.name], 2) == ids[:2]


async def test_a_task_s_first_grouped_defer_tells_the_workers(app: asyncq.App, aconn: Any) -> None:
    @app.task
    async def work(n: int = 0) -> None:
        pass

    channel = (await (await aconn.execute("SELECT asyncq_channel()")).fetchone())[0]
    await aconn.execute(f'LISTEN "{channel}"')
    await work.options(group="acme").defer(n=1)  # the first: told
    await work.options(group="globex").defer(n=2)  # known already: not told
    await work.defer(n=3)  # the wake-up of a ready job, as ever
    heard = []
    async for notify in aconn.notifies(timeout=1.0):
        heard.append(notify.payload)
    assert heard.count("\x1c") == 1, heard
