"""Test database: ``$ASYNCQ_TEST_DSN`` if set, else the embedded PostgreSQL.

One database per test session, migrated once; every test starts from an empty
jobs table. Tests that need no database do not touch these fixtures.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import asyncq
from asyncq import embedded
from tests.harness.ledger import Ledger

pytest_plugins = ["pytester"]  # the asyncq pytest plugin is tested in sub-pytests

SESSION_DB = f"asyncq_test_{os.getpid()}"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def server_dsn() -> str:
    """A DSN for the server (any database on it): the admin connection."""
    dsn = os.environ.get("ASYNCQ_TEST_DSN")
    if not dsn:
        try:
            dsn = embedded.start()
        except asyncq.AsyncqError as exc:
            pytest.skip(f"no test database: set ASYNCQ_TEST_DSN or install asyncq[embedded]: {exc}")
    try:
        with psycopg.connect(dsn, connect_timeout=10):
            pass
    except psycopg.OperationalError as exc:
        pytest.skip(f"test database unreachable: {exc}")
    return dsn


@pytest.fixture(scope="session")
def session_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh, migrated database for this test session."""
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{SESSION_DB}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{SESSION_DB}"')
    params = conninfo_to_dict(server_dsn)
    params["dbname"] = SESSION_DB
    dsn = make_conninfo(**params)

    import anyio

    async def migrate() -> None:
        async with asyncq.App(dsn) as app:
            await app.migrate()

    anyio.run(migrate)
    yield dsn
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{SESSION_DB}" WITH (FORCE)')


@pytest.fixture(scope="session")
def asyncq_dsn(session_dsn: str) -> str:
    """The asyncq pytest plugin's test schemas live in this session's database."""
    return session_dsn


@pytest.fixture
def dsn(session_dsn: str) -> str:
    """The session database with no jobs, queue settings, schedules or rate-limit starts."""
    with psycopg.connect(session_dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE asyncq_jobs, asyncq_queues, asyncq_schedules, asyncq_schedule_runs,"
            " asyncq_rate_starts, asyncq_result_listeners, asyncq_steps, asyncq_waits,"
            " asyncq_events, asyncq_workers, asyncq_audit, asyncq_limits, asyncq_fair_tasks,"
            " asyncq_queue_samples,"
            " asyncq_group_turns RESTART IDENTITY"
        )
    return session_dsn


@pytest.fixture
def throwaway_dsn(server_dsn: str) -> Iterator[str]:
    """A new, empty (never migrated) database on the test server, dropped afterwards."""
    name = f"asyncq_throwaway_{secrets.token_hex(4)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(server_dsn)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    """The ledger of the harness app's task runs in this test (`tests.harness.ledger`)."""
    return Ledger(tmp_path / "ledger.txt")


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection to the test database, for assertions."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[asyncq.App]:
    """An open App on the test database (register tasks on it in the test)."""
    async with asyncq.App(dsn) as opened:
        yield opened
