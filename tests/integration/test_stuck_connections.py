"""Connections stuck behind a proxy that hung (`tests.harness.proxy`): it forwards nothing
more on them and keeps their sockets open, so the kernel sees nothing wrong; only a
deadline can tell. The calls' paces, the look at a claim before it is cut, the sweep of
a pool's idle connections after a cut, the listener's check on demand, and a renewal
that misses an attempt whose outcome is being written. The whole worker behind such a
proxy is in ``tests/faults/test_hung_proxy.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import asyncq
from asyncq import pools
from asyncq.job import Job
from asyncq.pools import KeptConnection, Pace
from asyncq.store import Store
from asyncq.worker.dispatch import Dispatcher, State
from asyncq.worker.executor import Executor
from asyncq.worker.heartbeat import Heartbeat
from asyncq.worker.listener import Listener
from asyncq.worker.observer import Observer
from asyncq.worker.outcomes import Outcome
from asyncq.worker.slots import Slots
from asyncq.worker.sweep import Sweep
from asyncq.worker.threads import Threads
from asyncq.worker.wakeup import DueTimes, Wakeup
from tests.harness.proxy import Proxy, upstream_of

pytestmark = pytest.mark.anyio

SHORT = 0.3  # a pace's deadline here, before it has seen a call


async def until(predicate: Callable[[], object | Awaitable[object]], what: str) -> None:
    with anyio.fail_after(10):
        while True:
            found = predicate()
            if isinstance(found, Awaitable):
                found = await found
            if found:
                return
            await anyio.sleep(0.01)  # the state is another task's, or the server's


@pytest.fixture
def proxy(dsn: str) -> Iterator[Proxy]:
    with Proxy(upstream_of(dsn)) as made:
        yield made


def pool_for(dsn: str, size: int = 2) -> AsyncConnectionPool:
    return AsyncConnectionPool(
        dsn, min_size=size, max_size=size + 1, kwargs={"autocommit": True}, open=False
    )


@pytest.fixture
async def behind(proxy: Proxy, dsn: str) -> AsyncIterator[AsyncConnectionPool]:
    """A pool of three connections through the proxy, all made and idle."""
    pool = pool_for(proxy.route(dsn), 3)
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


class Looks:
    """A claim loop's look: is the server still at work on ``conn``'s statement? Asked on
    a new connection, straight to the server."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.answers: list[bool] = []

    async def __call__(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        info = conn.info
        pid, name = info.backend_pid, info.parameter_status("application_name")
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as fresh:
            busy = await Store().at_work(fresh, pid=pid, application_name=name)
        self.answers.append(busy)
        return busy


async def test_a_call_stuck_behind_a_hung_proxy_is_cut_once_a_look_finds_its_server_idle(
    behind: AsyncConnectionPool, proxy: Proxy, dsn: str
) -> None:
    looks = Looks(dsn)
    told: list[str] = []
    stop = pools.on_cut(behind, lambda: told.append("cut"))
    kept = KeptConnection(behind, deadline=Pace(60.0, first=SHORT), look=looks)
    try:
        async with kept.connection() as conn:
            await conn.execute("SELECT 1")
        assert proxy.wedge() == 3
        with anyio.fail_after(10), pytest.raises(TimeoutError, match="not at work on it"):
            async with kept.connection() as conn:  # the same connection, kept
                await conn.execute("SELECT 1")
        assert conn.closed  # the pool replaces it
        assert looks.answers == [False] and told == ["cut"]
    finally:
        stop()
        await kept.release()


async def test_a_call_its_server_is_at_work_on_is_left_to_the_ceiling(dsn: str) -> None:
    looks = Looks(dsn)
    pool = pool_for(dsn)
    async with pool:
        kept = KeptConnection(pool, deadline=Pace(1.5, first=SHORT), look=looks)
        try:
            with anyio.fail_after(10), pytest.raises(TimeoutError, match=r"longer than 1\.5s"):
                async with kept.connection() as conn:
                    await conn.execute("SELECT pg_sleep(30)")
        finally:
            await kept.release()
    assert looks.answers == [True]  # looked at once, found at work: no second look


async def test_at_work_finds_a_session_by_its_process_or_behind_a_pooler_by_its_name(
    dsn: str,
) -> None:
    store = Store()
    name = "asyncq:test:at_work"
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True, application_name=name) as busy,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as idle,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as looking,
    ):
        sleeping = asyncio.create_task(busy.execute("SELECT pg_sleep(30)"))
        try:
            await until(
                lambda: store.at_work(looking, pid=busy.info.backend_pid, application_name=name),
                "the sleeping session at work",
            )
            assert not await store.at_work(
                looking, pid=idle.info.backend_pid, application_name=None
            )
            # Behind a pooler the process id this connection was told is not the server
            # process's: then any session of that application_name counts.
            query = store.q["at_work"]
            for application_name, expected in ((name, True), ("asyncq:nobody", False)):
                params = {"own_pid": 0, "pid": 0, "application_name": application_name}
                row = await (await looking.execute(query, params)).fetchone()
                assert row == (expected,)
        finally:
            await busy.cancel_safe()
            with pytest.raises(psycopg.errors.QueryCanceled):
                await sleeping


async def test_a_cut_sweeps_the_pool_s_idle_connections_and_tells_the_listener(
    behind: AsyncConnectionPool, proxy: Proxy
) -> None:
    checks: list[str] = []
    sweep = Sweep(
        pools=[behind], also=[lambda: checks.append("check")], pace=Pace(5.0, first=SHORT)
    )
    async with anyio.create_task_group() as services:
        await services.start(sweep.run)
        assert proxy.wedge() == 3
        with pytest.raises(TimeoutError):
            async with pools.connection(behind, SHORT) as conn:
                await conn.execute("SELECT 1")
        await until(lambda: sweep.sweeps, "a sweep")
        # The two others, idle and as stuck, were cut together: the pool made new ones.
        assert (sweep.dead, checks) == (2, ["check"])
        with anyio.fail_after(10):
            for _ in range(3):
                async with pools.connection(behind, 5.0) as conn:
                    await conn.execute("SELECT 1")
        services.cancel_scope.cancel()


class Seen(Observer):
    def __init__(self) -> None:
        self.connected: list[bool] = []
        self.failed: list[tuple[str, str]] = []
        self.lost: list[tuple[int, str]] = []

    def listener_connected(self, reconnected: bool) -> None:
        self.connected.append(reconnected)

    def service_failed(self, service: str, error: BaseException, retry_in: float) -> None:
        self.failed.append((service, type(error).__name__))

    def lease_lost(self, job: Job, why: str) -> None:
        self.lost.append((job.id, why))


async def test_check_now_finds_a_stuck_listen_connection_without_waiting_for_the_interval(
    proxy: Proxy, dsn: str
) -> None:
    store = Store()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        channel = await store.channel(conn)
    seen = Seen()
    wakeup = Wakeup()
    listener = Listener(
        connect=lambda: psycopg.AsyncConnection.connect(proxy.route(dsn), autocommit=True),
        store=store,
        channel=channel,
        queues=None,
        wakeup=wakeup,
        due=DueTimes(wakeup),
        abort=lambda job_id, claim: None,
        waiting_due=DueTimes(Wakeup()),
        health_interval=3600.0,  # no check of its own in this test
        health_timeout=5.0,
        observer=seen,
        pace=Pace(5.0, first=SHORT),
    )
    async with anyio.create_task_group() as services:
        await services.start(listener.run)
        # Listening: connected, caught up, and waiting for notifications.
        await until(lambda: listener._waiting is not None and proxy.listeners(), "LISTEN")
        assert proxy.freeze_listeners() == 1
        listener.check_now()
        await until(lambda: seen.connected == [False, True], "a new LISTEN connection")
        assert seen.failed == [("listener", "TimeoutError")]
        services.cancel_scope.cancel()


class Noop:
    name = "stuck.noop"
    retry = asyncq.Backoff(base=1, cap=1, jitter=0)
    retry_on = None
    timeout = None
    blocking = False

    async def call_stored(self, stored_args: Any) -> None:
        return None


async def test_a_renewal_that_misses_an_ended_attempt_being_written_loses_nothing(
    dsn: str,
) -> None:
    """The outcome's write and a renewal sent together (both tried again after a fault):
    the write commits first, the renewal finds the job done, and the write's answer has
    not come back yet. The attempt has ended: it is not lost, its write tells."""
    store = Store()
    seen = Seen()
    outcomes: list[Outcome] = []
    tasks = {Noop.name: Noop()}
    pool = pool_for(dsn)
    async with pool:
        async with pools.connection(pool) as conn:
            await conn.execute(
                "INSERT INTO asyncq_jobs (task_name, args) VALUES (%s, '{}')", (Noop.name,)
            )
            [job] = await store.claim(
                conn, worker="w", limit=1, queues=None, lease=timedelta(seconds=30)
            )
        dispatcher = Dispatcher(
            concurrency=1,
            tasks=tasks,  # type: ignore[arg-type]
            executor=Executor(tasks=tasks, worker="w", threads=Threads(1)),  # type: ignore[arg-type]
            slots=Slots(1),
            submit=outcomes.append,
            observer=seen,
            lease=30.0,
        )
        dispatcher.start()
        dispatcher.hold(job)
        await until(lambda: outcomes, "the attempt to end")
        [attempt] = dispatcher.attempts()
        assert attempt.state is State.ENDED
        async with pools.connection(pool) as conn:
            assert await store.mark_done(conn, worker="w", jobs=[job], results=[None])
        heartbeat = Heartbeat(
            pool=pool, store=store, worker="w", dispatcher=dispatcher, interval=7.5, observer=seen
        )
        await heartbeat.beat()
        assert seen.lost == []
        assert dispatcher.held[job.id] is attempt  # until its write's answer comes
        dispatcher.written([job])
        await dispatcher.stop(0)
