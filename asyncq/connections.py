"""The caller's connections that a defer may join: ``task.options(conn=...)``.

A psycopg 3 connection is used as it is (an ``AsyncConnection`` for ``defer``, a
``Connection`` for ``defer_sync``). Anything else is looked up by where its type comes
from: a SQLAlchemy session or connection (or an instance of a subclass, such as
SQLModel's sessions) is unwrapped to the psycopg connection under it
(`asyncq.contrib.sqlalchemy`).
"""

from __future__ import annotations

from typing import Any

import psycopg


def _refused(conn: object, wanted: str) -> TypeError:
    return TypeError(
        f"conn must be {wanted}, not {type(conn).__module__}.{type(conn).__qualname__}"
    )


def _from_sqlalchemy(conn: object) -> bool:
    return any(c.__module__.startswith("sqlalchemy.") for c in type(conn).__mro__)


async def async_connection(conn: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg ``AsyncConnection`` that ``defer`` writes on for ``conn``."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    if _from_sqlalchemy(conn):
        from asyncq.contrib import sqlalchemy

        return await sqlalchemy.async_connection(conn)
    if isinstance(conn, psycopg.Connection):
        raise TypeError(
            "conn is a synchronous psycopg Connection: defer on it with"
            " task.options(conn=...).defer_sync(...), or pass an AsyncConnection"
        )
    raise _refused(conn, "a psycopg AsyncConnection (or a SQLAlchemy AsyncSession)")


def sync_connection(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg ``Connection`` that ``defer_sync`` writes on for ``conn``."""
    if isinstance(conn, psycopg.Connection):
        return conn
    if _from_sqlalchemy(conn):
        from asyncq.contrib import sqlalchemy

        return sqlalchemy.sync_connection(conn)
    if isinstance(conn, psycopg.AsyncConnection):
        raise TypeError(
            "conn is a psycopg AsyncConnection: defer on it with"
            " await task.options(conn=...).defer(...), or pass a Connection"
        )
    raise _refused(conn, "a psycopg Connection (or a SQLAlchemy Session)")
