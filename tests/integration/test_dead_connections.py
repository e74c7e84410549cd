"""Connections that die, or never answer: the TCP options of every connection, and the
deadline of every database call.

A statement that never ends (``pg_sleep``) stands in for a peer that acknowledges every
packet and never answers: the kernel sees nothing wrong, only the deadline can end it.
The silent network itself is in ``tests/faults/test_partition.py``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import asyncq
from asyncq import pools
from asyncq.pools import TCP_DEFAULTS, KeptConnection, connection, for_dsn, tcp_defaults

pytestmark = pytest.mark.anyio

SLOW = "SELECT pg_sleep(30)"


def options_in_force(conn: psycopg.AsyncConnection[Any]) -> dict[str, str]:
    """The connection options libpq used for ``conn``."""
    return {o.keyword.decode(): o.val.decode() for o in conn.pgconn.info if o.val is not None}


def test_tcp_defaults_yield_to_the_dsn() -> None:
    assert tcp_defaults("host=db dbname=shop") == TCP_DEFAULTS
    assert tcp_defaults("postgresql://db/shop?keepalives_idle=60&tcp_user_timeout=0") == {
        "keepalives": 1,
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }
    assert tcp_defaults("host=db keepalives=0")["tcp_user_timeout"] == 6000


def test_a_listen_dsn_s_own_tcp_options_win_on_the_listen_connections() -> None:
    made_for_the_dsn = {
        "application_name": "asyncq:1:results",
        **tcp_defaults("keepalives_idle=30"),
    }
    assert for_dsn(made_for_the_dsn, "host=direct tcp_user_timeout=0") == {
        "application_name": "asyncq:1:results",
        "keepalives": 1,
        "keepalives_idle": 3,  # the main DSN's own value is not the listen DSN's
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }


async def test_every_connection_of_the_app_has_the_tcp_options(app: asyncq.App) -> None:
    async with app.pool.connection() as conn:
        found = options_in_force(conn)
    assert {k: found[k] for k in TCP_DEFAULTS} == {
        "keepalives": "1",
        "keepalives_idle": "3",
        "keepalives_interval": "1",
        "keepalives_count": "3",
        "tcp_user_timeout": "6000",
    }


async def test_the_dsn_s_own_tcp_options_win(dsn: str) -> None:
    own = psycopg.conninfo.make_conninfo(dsn, keepalives_idle=60, tcp_user_timeout=20000)
    async with asyncq.App(own) as app:
        assert app.connect_kwargs().keys().isdisjoint({"keepalives_idle", "tcp_user_timeout"})
        async with app.pool.connection() as conn:
            found = options_in_force(conn)
    assert (found["keepalives_idle"], found["tcp_user_timeout"]) == ("60", "20000")
    assert (found["keepalives_interval"], found["keepalives_count"]) == ("1", "3")


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[AsyncConnectionPool]:
    opened = AsyncConnectionPool(
        dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await opened.open(wait=True)
    try:
        yield opened
    finally:
        await opened.close()


async def backend(conn: psycopg.AsyncConnection[Any]) -> int:
    return conn.info.backend_pid


async def test_a_call_past_its_deadline_is_cut_and_its_connection_replaced(
    pool: AsyncConnectionPool,
) -> None:
    async with connection(pool) as conn:
        first = await backend(conn)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"longer than 0\.5s") as raised:
        async with connection(pool, 0.5) as conn:
            assert await backend(conn) == first
            await conn.execute(SLOW)
    took = time.monotonic() - began
    assert 0.45 < took < 10, took  # at its deadline, long before the statement would end
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)
    assert conn.closed  # not returned to the pool in an unknown state
    async with connection(pool) as conn:
        assert await backend(conn) != first
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
    assert pools.deadlines().watched == 0


async def test_a_call_cut_inside_a_transaction_is_cut_all_the_same(
    pool: AsyncConnectionPool,
) -> None:
    kept = KeptConnection(pool, deadline=0.3)
    try:
        with pytest.raises(TimeoutError):
            async with kept.connection() as conn, conn.transaction():
                await conn.execute("SELECT 1")
                await conn.execute(SLOW)
        assert conn.closed
        async with kept.connection() as again:  # another connection, and it works
            assert again is not conn
            assert await (await again.execute("SELECT 2")).fetchone() == (2,)
    finally:
        await kept.release()


async def test_a_call_within_its_deadline_keeps_its_connection(
    pool: AsyncConnectionPool,
) -> None:
    async with connection(pool, 1.0) as conn:
        first = await backend(conn)
        await conn.execute("SELECT pg_sleep(0.2)")
    await anyio.sleep(1.0)  # past the deadline: the timer finds nothing to cut
    async with connection(pool) as conn:
        assert await backend(conn) == first
    assert pools.deadlines().watched == 0


async def test_a_wait_for_a_connection_ends_at_the_deadline(dsn: str) -> None:
    small = AsyncConnectionPool(
        dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
    )
    async with small, connection(small):
        began = time.monotonic()
        with pytest.raises(psycopg.OperationalError):  # PoolTimeout
            async with connection(small, 0.3):
                pass
        assert time.monotonic() - began < 10  # the pool's own wait would be 30 s


async def test_app_calls_have_the_deadline(
    app: asyncq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admin calls of the App run with `pools.DEADLINE`: here 0.3 s, against a queue
    settings row locked by another transaction, which makes pause wait for ever."""
    monkeypatch.setattr(pools, "DEADLINE", 0.3)
    await app.pause("blocked")
    await app.resume("blocked")
    with psycopg.connect(app.dsn, autocommit=True) as other, other.transaction():
        other.execute("SELECT 1 FROM asyncq_queues WHERE name = 'blocked' FOR UPDATE")
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await app.pause("blocked")
        assert time.monotonic() - began < 10  # the lock is held for as long as the test
    # The abandoned statement may still run once the lock is gone: its answer is lost,
    # not its effect. The App goes on.
    await app.pause("blocked")
    with psycopg.connect(app.dsn) as check:
        paused = check.execute("SELECT paused_at FROM asyncq_queues WHERE name = 'blocked'")
        assert paused.fetchone() != (None,)
