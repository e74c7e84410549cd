"""Defer in a SQLAlchemy session's transaction: ``task.options(conn=session)``.

`asyncq.connections` hands SQLAlchemy objects here; each is unwrapped to the psycopg 3
connection under it, in the transaction the session (or connection) is in, so the job
row commits or rolls back with the ORM's writes.

- ``defer`` takes an ``AsyncSession``, an ``async_scoped_session`` (its current
  session) or an ``AsyncConnection`` from ``sqlalchemy.ext.asyncio``.
- ``defer_sync`` takes a ``Session``, a ``scoped_session`` or a ``Connection``.

A session not yet in a transaction begins one (``session.connection()``, as the ORM's
autobegin would), and so does a connection (``connection.begin()``): a job written
outside the transaction SQLAlchemy knows of would be rolled back when the connection
goes back to its pool. A session's pending objects are not flushed: ``flush()`` first
when the job needs a new row's id. A session with several binds writes the job on its
default bind; pass ``session.connection(bind_arguments=...)`` to choose another.

The engine must use the psycopg dialect (``postgresql+psycopg://``): an engine on
asyncpg, psycopg2 or another database is refused with a `TypeError` before the
session is touched. SQLAlchemy is imported only when one of its objects is passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

__all__ = ["async_connection", "sync_connection"]

_ASYNC = "an AsyncSession, async_scoped_session or AsyncConnection (sqlalchemy.ext.asyncio)"
_SYNC = "a Session, scoped_session or Connection (sqlalchemy.orm, sqlalchemy.engine)"


def _name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _check_dialect(dialect: Dialect, obj: object) -> None:
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise TypeError(
            f"{_name(obj)} runs on SQLAlchemy's {dialect.name}+{dialect.driver} dialect;"
            " asyncq writes jobs on psycopg 3 connections: create the engine with a"
            " postgresql+psycopg:// URL"
        )


async def async_connection(conn: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg ``AsyncConnection`` under a SQLAlchemy ``AsyncSession`` or
    ``AsyncConnection``, in its transaction (begun if it was not)."""
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.ext.asyncio import (
        AsyncConnection,
        AsyncEngine,
        AsyncSession,
        async_scoped_session,
    )
    from sqlalchemy.orm import Session, scoped_session

    given = conn
    if isinstance(conn, async_scoped_session):
        conn = conn()
    if isinstance(conn, AsyncSession):
        _check_dialect(conn.get_bind().dialect, given)
        connection = await conn.connection()
    elif isinstance(conn, AsyncConnection):
        _check_dialect(conn.dialect, given)
        if not conn.in_transaction():
            await conn.begin()
        connection = conn
    elif isinstance(conn, Session | scoped_session | Connection):
        raise TypeError(
            f"conn is a synchronous SQLAlchemy {type(conn).__name__}: defer on it with"
            " task.options(conn=...).defer_sync(...), or pass an AsyncSession"
        )
    elif isinstance(conn, Engine | AsyncEngine):
        raise TypeError(f"conn is an engine, which has no transaction: pass {_ASYNC}")
    else:
        raise TypeError(f"conn must be a psycopg AsyncConnection or {_ASYNC}, not {_name(given)}")
    driver = (await connection.get_raw_connection()).driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise TypeError(
            f"{_name(given)} runs on a {_name(driver)}, not a psycopg AsyncConnection:"
            " create the engine with a postgresql+psycopg:// URL"
        )
    return driver


def sync_connection(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg ``Connection`` under a SQLAlchemy ``Session`` or ``Connection``, in
    its transaction (begun if it was not)."""
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.orm import Session, scoped_session

    given = conn
    if isinstance(conn, scoped_session):
        conn = conn()
    if isinstance(conn, Session):
        _check_dialect(conn.get_bind().dialect, given)
        connection = conn.connection()
    elif isinstance(conn, Connection):
        _check_dialect(conn.dialect, given)
        if not conn.in_transaction():
            conn.begin()
        connection = conn
    elif type(conn).__module__.startswith("sqlalchemy.ext.asyncio."):
        raise TypeError(
            f"conn is an asyncio SQLAlchemy {type(conn).__name__}: defer on it with"
            " await task.options(conn=...).defer(...), or pass a Session"
        )
    elif isinstance(conn, Engine):
        raise TypeError(f"conn is an engine, which has no transaction: pass {_SYNC}")
    else:
        raise TypeError(f"conn must be a psycopg Connection or {_SYNC}, not {_name(given)}")
    driver = connection.connection.driver_connection
    if isinstance(driver, psycopg.AsyncConnection):
        raise TypeError(
            f"{_name(given)} runs on a psycopg AsyncConnection (an AsyncSession's, in"
            " run_sync): defer on the AsyncSession with await task.options(conn=...).defer(...)"
        )
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(
            f"{_name(given)} runs on a {_name(driver)}, not a psycopg Connection:"
            " create the engine with a postgresql+psycopg:// URL"
        )
    return driver
