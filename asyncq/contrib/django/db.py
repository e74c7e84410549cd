"""Django's database connections, as asyncq needs them: the psycopg 3 connection under
one (what ``enqueue`` writes on and ``get_result`` reads on), and a libpq DSN for the
database of an alias (what the worker's App connects to)."""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.conninfo import make_conninfo

# What Django's PostgreSQL backend passes to psycopg.connect beside libpq's parameters.
_NOT_LIBPQ = ("context", "cursor_factory", "prepare_threshold", "client_encoding")


def check_postgresql(alias: str) -> BaseDatabaseWrapper:
    """The connection of ``DATABASES[alias]``; `ImproperlyConfigured` unless it is
    PostgreSQL through psycopg 3."""
    if alias not in connections.settings:
        raise ImproperlyConfigured(f"DATABASES has no database {alias!r}")
    wrapper: BaseDatabaseWrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] is {wrapper.vendor}: asyncq needs PostgreSQL"
            " (ENGINE django.db.backends.postgresql)"
        )
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] connects with psycopg2: asyncq writes on psycopg 3"
            " connections (pip install 'psycopg[binary]'; Django then uses it)"
        )
    return wrapper


def psycopg_connection(wrapper: Any) -> psycopg.Connection[Any]:
    """The psycopg ``Connection`` under a Django connection (``django.db.connection``,
    ``connections[alias]``), connected if it was not, and in whatever transaction
    ``transaction.atomic()`` has open on it.

    Raises Django's ``TransactionManagementError`` inside an ``atomic`` block that an
    error has broken, as Django's own queries do."""
    if getattr(wrapper, "vendor", None) != "postgresql":
        raise TypeError(
            f"conn is a Django connection to {getattr(wrapper, 'vendor', 'an unknown database')}:"
            " asyncq needs PostgreSQL"
        )
    wrapper.ensure_connection()
    wrapper.validate_no_broken_transaction()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(
            "Django connects to PostgreSQL with psycopg2 here: asyncq writes on psycopg 3"
            " connections (pip install 'psycopg[binary]'; Django then uses it)"
        )
    return raw


def database_dsn(alias: str) -> str:
    """A libpq DSN for ``DATABASES[alias]``, built as Django's own connections are: NAME,
    USER, PASSWORD, HOST, PORT and the libpq parameters in OPTIONS (``sslmode``,
    ``service``, ``options``, ...). Holds the password: do not log it."""
    params = dict(check_postgresql(alias).get_connection_params())
    for key in _NOT_LIBPQ:
        params.pop(key, None)
    try:
        return make_conninfo("", **{key: value for key, value in params.items() if value != ""})
    except psycopg.ProgrammingError as exc:
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] cannot be a libpq DSN for asyncq's worker: {exc}"
            " (give the backend an OPTIONS 'dsn')"
        ) from None
