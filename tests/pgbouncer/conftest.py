"""Fixtures of the PgBouncer tests: a real pgbouncer in transaction pooling mode with two
server connections per database (`tests.harness.pgbouncer`), and Apps that go through it.

The tests that need one skip, and say why, when pgbouncer is not installed (Debian:
``apt-get install pgbouncer``: one line in the summary for all of them) or cannot reach
the test server.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import asyncq
from tests.harness import pgbouncer
from tests.harness.pgbouncer import PgBouncer

INSTALLED = pgbouncer.binary()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Raised here rather than by a mark or a fixture, the skip of every test has this
    # line for its place, and the summary folds them into one.
    if INSTALLED is None and "pgbouncer_binary" in getattr(item, "fixturenames", ()):
        pytest.skip(
            "pgbouncer is not installed (Debian: apt-get install pgbouncer):"
            " the PgBouncer tests run a real one"
        )


@pytest.fixture(scope="session")
def pgbouncer_binary() -> str:
    assert INSTALLED is not None  # the tests that ask for it are skipped without it
    return INSTALLED


def start(binary: str, server_dsn: str, **options: Any) -> PgBouncer:
    """A started PgBouncer in front of the test server; skips the test if it cannot
    reach the server through it."""
    bouncer = PgBouncer(binary, server_dsn, **options)
    bouncer.start()
    try:
        with psycopg.connect(bouncer.through(server_dsn), prepare_threshold=None) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        log = bouncer.log.read_text(errors="replace")[-2000:]
        bouncer.close()
        pytest.skip(f"pgbouncer cannot reach the test server: {exc}\n{log}")
    return bouncer


@pytest.fixture(scope="session")
def bouncer(pgbouncer_binary: str, server_dsn: str) -> Iterator[PgBouncer]:
    """One PgBouncer for the session: transaction mode, two server connections per
    database."""
    started = start(pgbouncer_binary, server_dsn)
    yield started
    started.close()


@pytest.fixture
def bounced_dsn(dsn: str, bouncer: PgBouncer) -> str:
    """The test database (its jobs table empty) through PgBouncer."""
    return bouncer.through(dsn)


def bounced_app(bouncer: PgBouncer, dsn: str, *, listen: bool = True, **options: Any) -> asyncq.App:
    """An App on ``dsn`` through PgBouncer as the PgBouncer guide says: no prepared
    statements, and its LISTEN connections straight to the server (or none,
    ``listen=False``)."""
    if listen:
        options.setdefault("listen_dsn", dsn)
    else:
        options["listen"] = False
    return asyncq.App(bouncer.through(dsn), prepare_threshold=None, **options)


@pytest.fixture
async def app(dsn: str, bouncer: PgBouncer) -> AsyncIterator[asyncq.App]:
    """An open App through PgBouncer, listening straight to the server."""
    async with bounced_app(bouncer, dsn) as opened:
        yield opened


@pytest.fixture
def throwaway_dsn(server_dsn: str) -> Iterator[str]:
    """A new, empty (never migrated) database on the test server, dropped afterwards."""
    name = f"asyncq_pgb_{secrets.token_hex(4)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(server_dsn)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def advisory_locks(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """The advisory locks held in the connection's database (pid, objid) by any session."""
    return conn.execute(
        "SELECT pid, objid FROM pg_locks"
        " WHERE locktype = 'advisory' AND granted"
        "   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " ORDER BY 1"
    ).fetchall()
