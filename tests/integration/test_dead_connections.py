"""Connections that die, or never answer: the TCP options of every connection.

The silent network itself is in ``tests/faults/test_partition.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.pools import TCP_DEFAULTS, tcp_defaults

pytestmark = pytest.mark.anyio


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
