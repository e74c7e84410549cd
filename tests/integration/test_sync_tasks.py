"""Plain ``def`` tasks in the worker's thread pool, and ``defer_sync`` from synchronous
code, with real workers on a real database."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from tests.harness.waiting import until, wait_until

pytestmark = pytest.mark.anyio


def row(db: Any, job_id: int) -> tuple[Any, ...]:
    found = db.execute(
        "SELECT status::text, attempts, last_error, result FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return tuple(found)


class Gauge:
    """How many calls run at once, and the most that ever did."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


async def test_a_def_task_runs_in_a_thread_with_its_job_context_and_stores_its_result(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    loop_thread = threading.get_ident()
    seen: list[tuple[int, int, str]] = []

    @app.task(name="sync.add")
    def add(a: int, b: int = 1) -> int:
        job = asyncq.current_job()
        seen.append((threading.get_ident(), job.id, threading.current_thread().name))
        assert not job.stop_requested
        return a + b

    @app.task(name="sync.double")
    def double(n: int) -> int:
        return 2 * n

    assert isinstance(add, asyncq.SyncTask)
    assert double(21) == 42  # called directly, it is the function
    job_id = await add.defer(40, b=2)
    await drain()
    assert row(db, job_id) == ("done", 1, None, 42)
    [(ident, seen_id, name)] = seen
    assert ident != loop_thread
    assert seen_id == job_id
    assert name.startswith("asyncq-task-")


async def test_the_threads_option_bounds_how_many_def_tasks_run_at_once(
    app: asyncq.App, drain: Any
) -> None:
    gauge = Gauge()
    bound = 2

    @app.task(name="sync.busy")
    def busy(n: int) -> None:
        with gauge:
            # Each holds its thread until as many run at once as may (on a loaded machine
            # the threads start late), and a moment more, for one too many to show.
            wait_until(lambda: gauge.most >= bound, 20, f"{bound} calls at once")
            time.sleep(0.05)

    await busy.defer_many([{"n": n} for n in range(8)])
    stats = await drain(concurrency=8, threads=2)
    assert stats.done == 8
    assert gauge.most == 2

    gauge.most, bound = 0, 3
    await busy.defer_many([{"n": n} for n in range(6)])
    stats = await drain(concurrency=3)  # default: as many threads as the concurrency
    assert stats.done == 6
    assert gauge.most == 3


async def test_a_blocking_def_task_leaves_the_event_loop_free(app: asyncq.App, drain: Any) -> None:
    order: list[str] = []
    release = threading.Event()

    @app.task(name="sync.blocks")
    def blocks() -> None:
        release.wait(10)  # released by the async task below: only if the loop runs
        order.append("sync ended")

    @app.task(name="sync.async_side")
    async def async_side() -> None:
        await asyncio.sleep(0.05)
        order.append("async ended")
        release.set()

    await blocks.defer()
    await async_side.defer()
    stats = await drain(concurrency=2)
    assert stats.done == 2
    assert order == ["async ended", "sync ended"]


async def test_a_timed_out_def_task_is_failed_at_once_and_its_thread_told_to_stop(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    stopped = threading.Event()
    returned = threading.Event()

    @app.task(name="sync.slow", timeout=0.3, max_attempts=1)
    def slow() -> str:
        job = asyncq.current_job()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if job.stop_requested:
                stopped.set()
                break
            time.sleep(0.01)
        returned.set()
        return "late"

    job_id = await slow.defer()
    stats = await drain()
    assert stats.failed_attempts == 1
    status, attempts, last_error, result = row(db, job_id)
    assert (status, attempts, result) == ("failed", 1, None)
    assert "timed out" in last_error
    assert await anyio.to_thread.run_sync(stopped.wait, 20)
    assert await anyio.to_thread.run_sync(returned.wait, 20)
    await asyncio.sleep(0.1)  # a window for a late write to show: there is none
    assert row(db, job_id)[0] == "failed"  # what the thread returned late is dropped


async def test_cancelling_a_running_def_task_cancels_the_job_and_sets_stop_requested(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    started = threading.Event()
    stopped = threading.Event()

    @app.task(name="sync.cancellable")
    def cancellable() -> None:
        started.set()
        job = asyncq.current_job()
        while not job.stop_requested:
            time.sleep(0.01)
        stopped.set()

    job_id = await cancellable.defer()

    async def cancel_when_started() -> None:
        await anyio.to_thread.run_sync(started.wait, 10)
        assert await app.cancel(job_id) == {job_id: "aborting"}

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_when_started)
        stats = await drain()
    assert stats.cancelled == 1
    assert row(db, job_id)[0] == "cancelled"
    assert await anyio.to_thread.run_sync(stopped.wait, 5)


async def test_an_attempt_stopped_before_a_thread_took_it_never_runs(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    release = threading.Event()
    ran: list[str] = []

    @app.task(name="sync.first")
    def first() -> None:
        release.wait(10)

    @app.task(name="sync.second", timeout=0.2, max_attempts=1)
    def second() -> None:
        ran.append("second")

    await first.defer()
    second_id = await second.defer()

    async def release_later() -> None:
        # The second job waits for the only thread, and times out waiting.
        await until(lambda: row(db, second_id)[0] == "failed", what="the second job to time out")
        release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        await drain(concurrency=2, threads=1)
    assert row(db, second_id)[0] == "failed"
    await asyncio.sleep(0.1)  # a window for the thread to run it after all: it does not
    assert ran == []


async def test_defer_sync_writes_on_the_apps_synchronous_pool(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    @app.task(name="sync.echo")
    def echo(text: str) -> str:
        return text

    def from_threads() -> list[int]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda n: echo.defer_sync(f"t{n}"), range(200)))

    try:
        ids = await anyio.to_thread.run_sync(from_threads)
        unique = await anyio.to_thread.run_sync(
            lambda: [echo.options(unique_key="once").defer_sync("u") for _ in range(3)]
        )
    finally:
        await anyio.to_thread.run_sync(app.close_sync)
    assert len(set(ids)) == 200
    assert len(set(unique)) == 1
    stats = await drain(concurrency=10)
    assert stats.done == 201
    assert row(db, ids[7])[3] == "t7"


async def test_defer_sync_on_a_connection_commits_or_rolls_back_with_its_transaction(
    app: asyncq.App, dsn: str, db: Any
) -> None:
    @app.task(name="sync.tx")
    def tx(n: int) -> None:
        pass

    def write() -> tuple[int, int]:
        with psycopg.connect(dsn) as conn:
            with conn.transaction():
                kept = tx.options(conn=conn).defer_sync(1)
            try:
                with conn.transaction():
                    dropped = tx.options(conn=conn).defer_sync(2)
                    raise RuntimeError("the order failed")
            except RuntimeError:
                pass
        return kept, dropped

    kept, dropped = await anyio.to_thread.run_sync(write)
    ids = [r[0] for r in db.execute("SELECT id FROM asyncq_jobs ORDER BY id").fetchall()]
    assert ids == [kept]
    assert dropped not in ids


async def test_defer_sync_refuses_bad_input_and_writes_nothing(
    app: asyncq.App, dsn: str, db: Any
) -> None:
    @app.task(name="sync.strict")
    def strict(n: int) -> None:
        pass

    with pytest.raises(TypeError, match="JSON"):
        strict.defer_sync(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"sync\.strict"):
        strict.defer_sync(1, 2)  # type: ignore[call-arg]
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        with pytest.raises(TypeError, match="AsyncConnection"):
            strict.options(conn=aconn).defer_sync(1)
    with psycopg.connect(dsn) as conn, pytest.raises(TypeError, match="defer_sync"):
        await strict.options(conn=conn).defer(1)
    with pytest.raises(TypeError, match="psycopg Connection"):
        strict.options(conn="postgresql://nowhere").defer_sync(1)
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (0,)
