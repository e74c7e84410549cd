"""Results across processes: an `asyncq worker` process stores what the harness's tasks
return, and `App.result` in this process waits for it on one LISTEN connection."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

import asyncq
from tests.harness.app import ECHO, UNSTORABLE
from tests.harness.jobs import insert_jobs
from tests.harness.processes import Workers
from tests.harness.waiting import until

pytestmark = pytest.mark.anyio

NEVER = 3600.0


async def test_a_worker_process_stores_the_result_and_a_waiter_here_gets_it(
    dsn: str, db: Any, workers: Workers
) -> None:
    async with asyncq.App(dsn) as app:
        value = {"order": 42, "items": ["a", "b"], "paid": True}
        [job_id] = insert_jobs(db, ECHO, [{"value": value}])
        waiter = asyncio.ensure_future(app.result(job_id, timeout=30))
        worker = workers.start()
        assert await waiter == {"order": 42, "items": ["a", "b"], "paid": True}
        assert await app.result(job_id, timeout=5) == {
            "order": 42,
            "items": ["a", "b"],
            "paid": True,
        }
        [nothing] = insert_jobs(db, ECHO, [{}])
        assert await app.result(nothing, timeout=30) is None
        async with app.pool.connection() as conn:
            cur = await conn.execute("SELECT result FROM asyncq_jobs WHERE id = %s", (nothing,))
            assert await cur.fetchone() == (None,)
    assert workers.stop_all() == {worker.pid: 0}
    assert workers.tracebacks() == []


async def test_a_result_that_is_not_json_leaves_the_job_done_and_the_worker_says_why(
    dsn: str, db: Any, workers: Workers
) -> None:
    async with asyncq.App(dsn) as app:
        worker = workers.start()
        for kind, reason in [("set", "Object of type set"), ("nan", "Out of range float")]:
            [job_id] = insert_jobs(db, UNSTORABLE, [{"kind": kind}])
            assert await app.result(job_id, timeout=30) is None
            worker.wait_log(f"job {job_id} ({UNSTORABLE}) is done, but its result is not", 10)
            assert reason in worker.stderr()
    workers.stop_all()
    assert workers.tracebacks() == []


async def test_a_thousand_waiters_share_one_listen_connection_and_all_get_their_results(
    dsn: str, db: Any, workers: Workers
) -> None:
    name = "results-1000"
    async with asyncq.App(dsn, application_name=name, result_poll_interval=NEVER) as app:
        ids = insert_jobs(db, ECHO, [{"value": {"n": n}} for n in range(1000)])
        waiters = [asyncio.ensure_future(app.result(i, timeout=60)) for i in ids]
        await until(lambda: app.results.settled, what="the waiters to have made their look")
        async with app.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT application_name, query FROM pg_stat_activity"
                " WHERE application_name LIKE %s",
                (f"{name}:{os.getpid()}:%",),
            )
            listening = await cur.fetchall()
        assert [row[0] for row in listening] == [f"{name}:{os.getpid()}:results"]
        # Its last statement: the LISTEN, or the renewal of its row that follows it.
        assert listening[0][1].startswith(("LISTEN", "INSERT INTO asyncq_result_listeners"))
        workers.start("--concurrency", "50")
        answers = await asyncio.gather(*waiters)
        assert answers == [{"n": n} for n in range(1000)]
        # Every one of them heard of its job by a notification: the poll never ran.
        assert app.results.answered == {"notified": 1000}
        assert app.results.waiting == 0
    workers.stop_all()
    assert workers.tracebacks() == []
