"""Results: what a task returns is stored with its done row, and `App.result` waits for
it, woken by the notification of the statement that ends the job, with a poll as the
safety net."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq.job import Job
from tests.harness.waiting import until
from tests.integration.conftest import Drain

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)
NEVER = 3600.0  # a poll interval no test lasts


def stored(db: Any, job_id: int) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT status::text, result FROM asyncq_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.fixture
async def quiet_app(dsn: str) -> AsyncIterator[asyncq.App]:
    """An App that never polls: its waiters hear of a job only by a notification, or by
    the look made when they start (or when its LISTEN connection comes up)."""
    async with asyncq.App(dsn, result_poll_interval=NEVER) as opened:
        yield opened


async def test_a_result_is_stored_with_the_done_row_and_returned(
    app: asyncq.App, db: Any, drain: Drain
) -> None:
    @app.task(name="results.total")
    async def total(items: list[int]) -> dict[str, Any]:
        return {"total": sum(items), "items": items, "note": "ünïcødé ✓"}

    job_id = await total.defer([1, 2, 3])
    await drain()
    expected = {"total": 6, "items": [1, 2, 3], "note": "ünïcødé ✓"}
    assert stored(db, job_id) == ("done", expected)
    assert await app.result(job_id) == expected


async def test_a_task_that_returns_none_stores_null(app: asyncq.App, db: Any, drain: Drain) -> None:
    @app.task(name="results.nothing")
    async def nothing() -> None:
        pass

    job_id = await nothing.defer()
    await drain()
    assert stored(db, job_id) == ("done", None)
    assert db.execute("SELECT result IS NULL FROM asyncq_jobs").fetchone() == (True,)
    assert await app.result(job_id) is None


@pytest.mark.parametrize("returned", [{1, 2}, float("nan"), "NUL \x00"])
async def test_a_result_that_cannot_be_stored_leaves_the_job_done_with_a_warning(
    app: asyncq.App, db: Any, drain: Drain, caplog: pytest.LogCaptureFixture, returned: Any
) -> None:
    @app.task(name="results.odd")
    async def odd() -> Any:
        return returned

    job_id = await odd.defer()
    with caplog.at_level(logging.WARNING, logger="asyncq.worker"):
        await drain()
    assert stored(db, job_id) == ("done", None)
    assert await app.result(job_id) is None
    [warning] = [r for r in caplog.records if getattr(r, "action", None) == "result_not_stored"]
    assert warning.levelno == logging.WARNING
    assert f"job {job_id} (results.odd) is done, but its result is not stored" in (
        warning.getMessage()
    )
    assert "the result of results.odd" in warning.getMessage()


async def test_a_failed_job_raises_job_failed_with_its_last_error(
    app: asyncq.App, drain: Drain
) -> None:
    @app.task(name="results.broken", max_attempts=1)
    async def broken() -> None:
        raise ValueError("the gateway said no")

    job_id = await broken.defer()
    await drain()
    with pytest.raises(asyncq.JobFailed) as caught:
        await app.result(job_id)
    assert caught.value.job_id == job_id
    assert caught.value.last_error is not None
    assert caught.value.last_error.startswith("ValueError: the gateway said no")
    assert str(caught.value) == f"job {job_id} failed: ValueError: the gateway said no"
    assert isinstance(caught.value, asyncq.AsyncqError)


async def test_a_cancelled_job_raises_job_cancelled(app: asyncq.App, db: Any) -> None:
    @app.task(name="results.never_run")
    async def never_run() -> None:
        pass

    job_id = await never_run.defer()
    db.execute("UPDATE asyncq_jobs SET status = 'cancelled', finished_at = now()")
    with pytest.raises(asyncq.JobCancelled) as caught:
        await app.result(job_id)
    assert caught.value.job_id == job_id


async def test_an_unknown_id_raises_job_not_found(app: asyncq.App) -> None:
    for job_id in (12345, -1, 2**70):
        with pytest.raises(asyncq.JobNotFound) as caught:
            await app.result(job_id)
        assert caught.value.job_id == job_id


async def test_bad_arguments_are_refused_before_anything_waits(app: asyncq.App) -> None:
    with pytest.raises(TypeError):
        await app.result("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await app.result(True)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            await app.result(1, timeout=bad)
    assert app.results.waiting == 0
    with pytest.raises(asyncq.ConfigurationError):
        asyncq.App(result_poll_interval=0)


async def test_result_on_an_app_that_is_not_open_raises(dsn: str) -> None:
    with pytest.raises(asyncq.AppNotOpen):
        await asyncq.App(dsn).result(1)


async def test_a_job_that_does_not_end_in_time_raises_timeout_error(app: asyncq.App) -> None:
    @app.task(name="results.queued")
    async def queued() -> None:
        pass

    job_id = await queued.defer()
    with pytest.raises(TimeoutError):
        await app.result(job_id, timeout=0.3)
    assert app.results.waiting == 0  # the waiter is forgotten


@pytest.mark.parametrize("seconds", [0, 1e-6])
async def test_a_job_that_has_ended_answers_however_short_the_timeout(
    app: asyncq.App, drain: Drain, seconds: float
) -> None:
    @app.task(name="results.ended")
    async def ended(fail: bool) -> str:
        if fail:
            raise asyncq.Discard("no")
        return "ok"

    done, failed = await ended.defer(False), await ended.defer(True)
    cancelled, queued = [await ended.options(delay=3600).defer(False) for _ in range(2)]
    await app.cancel(cancelled)
    await drain()
    # The clock runs out before the first look, which is made all the same.
    assert await app.result(done, timeout=seconds) == "ok"
    with pytest.raises(asyncq.JobFailed, match="Discard: no"):
        await app.result(failed, timeout=seconds)
    with pytest.raises(asyncq.JobCancelled):
        await app.result(cancelled, timeout=seconds)
    with pytest.raises(asyncq.JobNotFound):
        await app.result(queued + 1000, timeout=seconds)
    with pytest.raises(TimeoutError):
        await app.result(queued, timeout=seconds)
    assert app.results.waiting == 0


async def test_a_waiter_that_starts_after_the_job_ended_returns_at_once(
    quiet_app: asyncq.App, drain: Drain
) -> None:
    @quiet_app.task(name="results.early")
    async def early() -> str:
        return "done early"

    job_id = await early.defer()
    await quiet_app.run_worker(drain=True, handle_signals=False)
    # Without a poll, and with no notification to come: the look at the start answers.
    assert await quiet_app.result(job_id, timeout=10) == "done early"
    assert quiet_app.results.answered == {"new": 1}


async def test_a_waiter_is_woken_by_the_notification(quiet_app: asyncq.App) -> None:
    @quiet_app.task(name="results.later")
    async def later() -> list[int]:
        return [4, 5]

    job_id = await later.defer()
    waiter = asyncio.ensure_future(quiet_app.result(job_id, timeout=20))
    await until(lambda: quiet_app.results.settled)
    await quiet_app.run_worker(drain=True, handle_signals=False)
    assert await waiter == [4, 5]
    assert quiet_app.results.answered == {"notified": 1}


async def test_a_cancel_wakes_the_waiters_of_a_queued_and_of_a_running_job(
    quiet_app: asyncq.App,
) -> None:
    started = asyncio.Event()

    @quiet_app.task(name="results.long")
    async def long() -> None:
        started.set()
        await asyncio.sleep(3600)

    running = await long.defer()
    queued = await long.options(delay=3600).defer()
    waiters = [asyncio.ensure_future(quiet_app.result(i, timeout=15)) for i in (running, queued)]
    worker = asyncio.ensure_future(quiet_app.run_worker(drain=True, handle_signals=False))
    with anyio.fail_after(10):
        await started.wait()
    await until(lambda: quiet_app.results.settled)
    assert await quiet_app.cancel(running, queued) == {running: "aborting", queued: "cancelled"}
    for waiter in waiters:
        with pytest.raises(asyncq.JobCancelled):
            await waiter
    await worker
    # The cancel statement announced the queued job, the worker's write the running one.
    assert quiet_app.results.answered == {"notified": 2}


async def test_the_poll_wakes_a_waiter_whose_job_ended_without_a_notification(
    dsn: str, db: Any
) -> None:
    async with asyncq.App(dsn, result_poll_interval=0.2) as app:
        job_id = db.execute(
            "INSERT INTO asyncq_jobs (task_name) VALUES ('elsewhere') RETURNING id"
        ).fetchone()[0]
        waiter = asyncio.ensure_future(app.result(job_id, timeout=20))
        await until(lambda: app.results.settled)
        # As a worker of the previous version ends a job: no notification.
        db.execute(
            "UPDATE asyncq_jobs SET status = 'done', result = '{\"by\": \"sql\"}' WHERE id = %s",
            (job_id,),
        )
        assert await waiter == {"by": "sql"}
        assert app.results.answered == {"poll": 1}


async def test_many_waiters_of_one_job_each_get_their_own_copy(
    app: asyncq.App, drain: Drain
) -> None:
    @app.task(name="results.shared")
    async def shared() -> dict[str, list[int]]:
        return {"xs": [1]}

    job_id = await shared.defer()
    waiters = [asyncio.ensure_future(app.result(job_id, timeout=20)) for _ in range(3)]
    await drain()
    answers = await asyncio.gather(*waiters)
    assert answers == [{"xs": [1]}] * 3
    answers[0]["xs"].append(2)
    assert answers[1] == {"xs": [1]}


async def test_the_listener_reconnects_and_looks_again(
    quiet_app: asyncq.App, db: Any, drain: Drain
) -> None:
    @quiet_app.task(name="results.after_reconnect")
    async def after_reconnect() -> int:
        return 7

    job_id = await after_reconnect.defer()
    waiter = asyncio.ensure_future(quiet_app.result(job_id, timeout=30))
    await until(lambda: quiet_app.results.settled)
    name = f"asyncq:{os.getpid()}:results"
    killed = db.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
        (name,),
    ).fetchone()
    assert killed == (1,)
    # Ended while the listener is down: only the look after the reconnect can see it.
    db.execute("UPDATE asyncq_jobs SET status = 'done', result = '7' WHERE id = %s", (job_id,))
    assert await waiter == 7
    assert quiet_app.results.reconnects == 1
    assert quiet_app.results.answered == {"listening": 1}


async def test_closing_the_app_ends_its_waiters_and_its_listen_connection(
    dsn: str, db: Any
) -> None:
    app = asyncq.App(dsn, application_name="closing")
    await app.open()
    [job_id] = db.execute(
        "INSERT INTO asyncq_jobs (task_name) VALUES ('t') RETURNING id"
    ).fetchone()
    waiter = asyncio.ensure_future(app.result(job_id))
    await until(lambda: app.results.settled)
    await app.close()
    with pytest.raises(asyncq.AppNotOpen):
        await waiter

    def gone() -> bool:  # a backend leaves pg_stat_activity soon after its client closes
        row = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'closing:%%'"
        ).fetchone()
        return row == (0,)

    await until(gone)


# -- the notifications of the statements that end jobs ---------------------------------


@pytest.fixture
def channel(db: Any) -> str:
    row = db.execute("SELECT asyncq_results_channel()").fetchone()
    assert row is not None
    return str(row[0])


def heard(listener: psycopg.Connection[Any]) -> list[str]:
    listener.execute("SELECT 1")  # notifications arrive with the next round trip
    return [n.payload for n in listener.notifies(timeout=0.5, stop_after=100)]


@pytest.fixture
def listener(dsn: str, channel: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'LISTEN "{channel}"')
        conn.execute("INSERT INTO asyncq_result_listeners (listener) VALUES ('test')")
        yield conn


def test_ids_are_sent_in_chunks_that_fit_a_payload(db: Any, listener: Any, channel: str) -> None:
    big = 9_000_000_000_000_000_000  # 19 digits: the longest ids
    db.execute(
        "SELECT asyncq_notify_ids(%s, array(SELECT %s + i FROM generate_series(1, 1000) AS i))",
        (channel, big),
    )
    payloads = heard(listener)
    assert [len(p.split(",")) for p in payloads] == [300, 300, 300, 100]
    assert all(len(p.encode()) < 8000 for p in payloads)
    ids = [int(i) for p in payloads for i in p.split(",")]
    assert ids == [big + i for i in range(1, 1001)]
    db.execute("SELECT asyncq_notify_ids(%s, NULL), asyncq_notify_ids(%s, '{}')", (channel,) * 2)
    assert heard(listener) == []


async def test_a_retry_is_not_announced_and_a_failure_is(
    app: asyncq.App, listener: Any, drain: Drain
) -> None:
    @app.task(name="results.twice", max_attempts=2, retry=AT_ONCE)
    async def twice() -> None:
        raise RuntimeError("no")

    job_id = await twice.defer()
    await drain()
    await drain()
    assert heard(listener) == [str(job_id)]  # once, when it failed for good


async def test_the_reaper_and_the_hand_back_announce_the_jobs_they_fail(
    app: asyncq.App, db: Any, listener: Any
) -> None:
    ids = [
        row[0]
        for row in db.execute(
            "INSERT INTO asyncq_jobs (task_name, status, attempts, max_attempts, claims,"
            " handbacks, locked_by, expires_at)"
            " SELECT 't', 'running', 1, 1, 1, 5, 'w', now() - interval '1 minute'"
            " FROM generate_series(1, 3) RETURNING id"
        ).fetchall()
    ]
    store = app.store
    jobs = [Job(ids[2], "t", "q", "{}", 1, 1, 1)]
    async with app.pool.connection() as conn:
        assert await store.release(conn, worker="w", jobs=jobs, free_handbacks=3) == {
            ids[2]: "failed"
        }
        assert await store.reap_expired(conn, limit=10) == {ids[0]: "failed", ids[1]: "failed"}
    assert heard(listener) == [str(ids[2]), f"{ids[0]},{ids[1]}"]


async def test_a_result_the_database_refuses_leaves_the_job_done_without_it(
    server_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.integration.test_encodings import database_in

    with database_in(server_dsn, "LATIN1") as latin1:
        app = asyncq.App(latin1)

        @app.task(name="results.tick")
        async def tick(refused: bool) -> dict[str, str]:
            return {"mark": "✓" if refused else "café"}  # LATIN1 has no ✓

        async with app:
            await app.migrate()
            storable = await tick.defer(False)
            refused = await tick.defer(True)
            with caplog.at_level(logging.WARNING, logger="asyncq.worker"):
                stats = await app.run_worker(drain=True, handle_signals=False)
            assert stats.done == 2
            assert await app.result(storable, timeout=10) == {"mark": "café"}
            assert await app.result(refused, timeout=10) is None
    [warning] = [r for r in caplog.records if getattr(r, "action", None) == "result_not_stored"]
    assert f"job {refused} (results.tick) is done, but its result is not stored:" in (
        warning.getMessage()
    )
    assert "the database refused it: UntranslatableCharacter" in warning.getMessage()


async def test_apps_in_two_schemas_wait_for_their_own_jobs(throwaway_dsn: str) -> None:
    def app_in(schema: str) -> asyncq.App:
        app = asyncq.App(throwaway_dsn, schema=schema)

        @app.task(name="results.where")
        async def where() -> str:
            return schema

        return app

    apps = [app_in("shop"), app_in("billing")]

    async with apps[0], apps[1]:
        for app in apps:
            await app.migrate()
        # The same id in both schemas: each App's waiter hears of its own job only.
        ids = [await app.tasks["results.where"].defer() for app in apps]
        assert ids[0] == ids[1]
        waiters = [asyncio.ensure_future(app.result(ids[0], timeout=20)) for app in apps]
        await apps[0].run_worker(drain=True, handle_signals=False)
        assert await waiters[0] == "shop"
        assert not waiters[1].done()
        await apps[1].run_worker(drain=True, handle_signals=False)
        assert await waiters[1] == "billing"


def test_an_app_waits_again_after_it_reopens_in_another_event_loop(dsn: str, db: Any) -> None:
    app = asyncq.App(dsn, result_poll_interval=NEVER)

    async def wait_once() -> Any:
        [job_id] = db.execute(
            "INSERT INTO asyncq_jobs (task_name) VALUES ('t') RETURNING id"
        ).fetchone()
        async with app:
            waiter = asyncio.ensure_future(app.result(job_id, timeout=10))
            await until(lambda: app.results.settled)  # its look made, it waits for news
            db.execute(
                "WITH ended AS (UPDATE asyncq_jobs SET status = 'done', result = '1'"
                "               WHERE id = %s RETURNING id)"
                " SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)) FROM ended",
                (job_id,),
            )
            return await waiter

    assert anyio.run(wait_once) == 1
    assert anyio.run(wait_once) == 1


def test_nothing_is_announced_while_no_app_listens(db: Any, channel: str, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'LISTEN "{channel}"')  # a LISTEN without its row: as if nobody waits
        db.execute("SELECT asyncq_notify_ids(%s, '{1,2,3}')", (channel,))
        assert heard(conn) == []
        conn.execute(
            "INSERT INTO asyncq_result_listeners (listener, seen_at)"
            " VALUES ('gone', now() - interval '2 minutes')"
        )
        db.execute("SELECT asyncq_notify_ids(%s, '{4}')", (channel,))
        assert heard(conn) == []  # a row not renewed for a minute: its App is gone
        conn.execute("UPDATE asyncq_result_listeners SET seen_at = now()")
        db.execute("SELECT asyncq_notify_ids(%s, '{5}')", (channel,))
        assert heard(conn) == ["5"]


async def test_an_app_listening_for_results_has_its_row_until_it_closes(dsn: str, db: Any) -> None:
    async with asyncq.App(dsn) as app:
        [job_id] = db.execute(
            "INSERT INTO asyncq_jobs (task_name) VALUES ('t') RETURNING id"
        ).fetchone()
        waiter = asyncio.ensure_future(app.result(job_id, timeout=10))
        await until(lambda: app.results.settled)
        rows = db.execute("SELECT listener FROM asyncq_result_listeners").fetchall()
        assert rows == [(app.results.name,)]
        waiter.cancel()
    await until(
        lambda: db.execute("SELECT count(*) FROM asyncq_result_listeners").fetchone() == (0,)
    )
