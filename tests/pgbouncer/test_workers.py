"""Workers and results through PgBouncer in transaction mode: woken by notifications on
a LISTEN connection straight to the server (``listen_dsn``), or polling without one
(``listen=False``); retries and every outcome; ``app.result``; a cancel of a running
job; a concurrency limit across two workers."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from tests.harness.pgbouncer import PgBouncer
from tests.harness.waiting import until
from tests.pgbouncer.conftest import bounced_app

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)


def listening(db: psycopg.Connection[Any], role: str) -> int:
    """This process's LISTEN connections of ``role`` (``listener``, ``results``) on the
    server that have sent their first statement."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE %s AND query <> ''",
        (f"asyncq:%:{role}",),
    ).fetchone()
    assert row is not None
    return int(row[0])


def bounced_clients(bouncer: PgBouncer, role: str) -> list[dict[str, object]]:
    return [c for c in bouncer.clients() if str(c["application_name"]).endswith(f":{role}")]


def statuses(db: psycopg.Connection[Any], ids: list[int]) -> list[str]:
    rows = db.execute(
        "SELECT status::text FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    return [r[0] for r in rows]


async def test_a_worker_listening_straight_to_the_server_is_woken_by_notifications(
    app: asyncq.App, bouncer: PgBouncer, db: Any
) -> None:
    ran: list[int] = []

    @app.task(name="pgb.record")
    async def record(n: int) -> None:
        ran.append(n)

    async with anyio.create_task_group() as tg:
        # It polls once a minute: within this test, only a notification makes it claim.
        tg.start_soon(partial(app.run_worker, poll_interval=60, handle_signals=False))
        await until(lambda: listening(db, "listener") == 1, what="the worker to listen")
        await record.defer(1)
        # Well before the poll, a minute away.
        await until(lambda: ran == [1], what="the job to run, woken by its notification")
        await record.defer_many([{"n": n} for n in range(2, 12)])
        await until(lambda: sorted(ran) == list(range(1, 12)), what="the jobs to run")
        assert bounced_clients(bouncer, "listener") == []  # the LISTEN went straight there
        assert listening(db, "listener") == 1
        tg.cancel_scope.cancel()


async def test_without_listen_a_worker_polls(bouncer: PgBouncer, dsn: str, db: Any) -> None:
    app = bounced_app(bouncer, dsn, listen=False)
    ran: list[int] = []

    @app.task(name="pgb.record")
    async def record(n: int) -> None:
        ran.append(n)

    async with app, anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run_worker, poll_interval=0.2, handle_signals=False))
        await anyio.sleep(0.5)  # most likely past its first claim: the jobs come in by polls
        await record.defer(1)
        await record.options(delay=0.5).defer(2)
        await record.defer_many([{"n": n} for n in range(3, 10)])
        await until(lambda: sorted(ran) == list(range(1, 10)), what="the jobs to run")
        assert listening(db, "listener") == 0
        tg.cancel_scope.cancel()


async def test_retries_and_every_outcome(app: asyncq.App, db: Any) -> None:
    attempts: dict[str, int] = {}

    def attempt(name: str) -> int:
        attempts[name] = attempts.get(name, 0) + 1
        return attempts[name]

    @app.task(name="pgb.flaky", retry=AT_ONCE, max_attempts=3)
    async def flaky() -> str:
        if attempt("flaky") == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    @app.task(name="pgb.doomed", retry=AT_ONCE, max_attempts=2)
    async def doomed() -> None:
        attempt("doomed")
        raise ValueError("always fails")

    @app.task(name="pgb.steered", max_attempts=2)
    async def steered(how: str) -> int:
        n = attempt(how)
        if how == "retry" and n == 1:
            raise asyncq.Retry(after=0.05)
        if how == "snooze" and n == 1:
            raise asyncq.Snooze(0.05)
        if how == "discard":
            raise asyncq.Discard("not wanted")
        return n

    ids = [
        await flaky.defer(),
        await doomed.defer(),
        *[await steered.defer(how) for how in ("retry", "snooze", "discard")],
    ]
    with anyio.fail_after(30):
        while set(statuses(db, ids)) - {"done", "failed"}:
            await app.run_worker(drain=True, handle_signals=False, poll_interval=0.05)
            await anyio.sleep(0.06)
    rows = db.execute(
        "SELECT status::text, attempts, result, last_error FROM asyncq_jobs"
        " WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    ).fetchall()
    assert [r[:3] for r in rows] == [
        ("done", 2, "ok"),
        ("failed", 2, None),
        ("done", 2, 2),
        ("done", 1, 2),  # a snooze does not count the attempt
        ("failed", 1, None),
    ]
    assert "ValueError: always fails" in rows[1][3]
    assert "not wanted" in rows[4][3]
    assert await app.result(ids[0], timeout=5) == "ok"
    with pytest.raises(asyncq.JobFailed, match="always fails"):
        await app.result(ids[1], timeout=5)


@pytest.mark.parametrize("listen", [True, False], ids=["listen_dsn", "no-listen"])
async def test_app_result(bouncer: PgBouncer, dsn: str, db: Any, listen: bool) -> None:
    """With ``listen_dsn`` the waiter is woken by the notification (its poll is a minute
    away); without LISTEN, by its poll."""
    app = bounced_app(bouncer, dsn, listen=listen, result_poll_interval=60 if listen else 0.2)
    gate = anyio.Event()

    @app.task(name="pgb.answer")
    async def answer(n: int) -> int:
        await gate.wait()
        return n * 2

    async with app, anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run_worker, poll_interval=0.2, handle_signals=False))
        job_id = await answer.defer(21)
        results: list[int] = []

        async def wait() -> None:
            results.append(await app.result(job_id, timeout=10))

        tg.start_soon(wait)
        await until(lambda: app.results.waiting and app.results.settled, what="the waiter")
        gate.set()
        await until(lambda: results == [42], what="the result")
        assert app.results.answered == {"notified" if listen else "poll": 1}
        assert listening(db, "results") == (1 if listen else 0)
        assert bounced_clients(bouncer, "results") == []
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("listen", [True, False], ids=["listen_dsn", "no-listen"])
async def test_cancel_stops_a_running_job_before_its_heartbeat_would(
    bouncer: PgBouncer, dsn: str, db: Any, listen: bool
) -> None:
    """Told on the LISTEN connection, or found by the worker's look for cancels every
    poll interval; not left to the heartbeat (every quarter of the 5 min lease)."""
    app = bounced_app(bouncer, dsn, listen=listen)
    started = anyio.Event()
    stopped: list[str] = []

    @app.task(name="pgb.long")
    async def long() -> None:
        started.set()
        try:
            await anyio.sleep(60)
        finally:
            stopped.append("finally")

    async with app, anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run_worker, poll_interval=0.2, lease=300, handle_signals=False))
        job_id = await long.defer()
        with anyio.fail_after(10):
            await started.wait()
        assert await app.cancel(job_id) == {job_id: "aborting"}
        await until(lambda: statuses(db, [job_id]) == ["cancelled"], what="the job to be cancelled")
        assert stopped == ["finally"]
        tg.cancel_scope.cancel()


async def test_a_concurrency_limit_holds_across_two_workers(
    bouncer: PgBouncer, dsn: str, db: Any
) -> None:
    running: list[int] = []
    most = [0]
    ran: list[int] = []

    def app_with_task() -> tuple[asyncq.App, asyncq.Task[Any, Any]]:
        app = bounced_app(bouncer, dsn)

        @app.task(name="pgb.limited", concurrency=2)
        async def limited(n: int) -> None:
            running.append(n)
            most[0] = max(most[0], len(running))
            await anyio.sleep(0.1)
            running.remove(n)
            ran.append(n)

        return app, limited

    (one, limited), (two, _) = app_with_task(), app_with_task()
    async with one, two, anyio.create_task_group() as tg:
        await limited.defer_many([{"n": n} for n in range(16)])
        for app in (one, two):
            tg.start_soon(
                partial(app.run_worker, concurrency=6, poll_interval=0.1, handle_signals=False)
            )
        await until(lambda: len(ran) == 16, what="the limited jobs to run")
        tg.cancel_scope.cancel()
    assert sorted(ran) == list(range(16))
    assert most[0] == 2
