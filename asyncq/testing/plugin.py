"""The asyncq pytest plugin (registered on install, as ``asyncq``): an empty asyncq
schema for each test, and the user's App bound to it.

Fixtures:

- ``asyncq_app`` (override it): the App under test, closed, with its tasks registered.
  The default is a new ``asyncq.App()`` with no tasks.
- ``asyncq_test_app``: ``asyncq_app`` bound (`App.rebind`) to this session's test
  schema, emptied for the test, and open; unbound and closed after the test. An
  async fixture, run by anyio's pytest plugin (mark the tests ``pytest.mark.anyio``).
- ``asyncq_dsn`` (session): the test database: ``--asyncq-dsn``, else
  ``$ASYNCQ_TEST_DSN``, else the embedded PostgreSQL (``asyncq[embedded]``); tests that
  use it are skipped, saying why, when none is reachable. Override it to reuse a
  database your suite makes.
- ``asyncq_schema`` (session): the test schema's name, migrated once per session (and
  per pytest-xdist worker: the name holds the process id), dropped at its end.

The schema is made once by ``asyncq.migrate`` (the real migrations) and emptied before
each test by one DELETE round trip. Measured on a loaded machine: running the
migrations into a fresh schema costs ~90-130 ms a test, the same SQL as one script
~50 ms, a TRUNCATE of the six tables ~70 ms, the DELETE ~1 ms. Job ids are not reset,
so an id never names a job of an earlier test.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator

import anyio
import psycopg
import pytest
from psycopg import sql

from asyncq import embedded, migrate
from asyncq.app import App
from asyncq.errors import AsyncqError

ENV = "ASYNCQ_TEST_DSN"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("asyncq")
    group.addoption(
        "--asyncq-dsn",
        default=None,
        help=f"the PostgreSQL of asyncq's test schemas (default: ${ENV}, else the embedded one)",
    )


@pytest.fixture(scope="session")
def asyncq_dsn(request: pytest.FixtureRequest) -> str:
    """The test database (see the module's docstring)."""
    dsn: str | None = request.config.getoption("asyncq_dsn") or os.environ.get(ENV)
    if not dsn:
        try:
            dsn = embedded.start()
        except AsyncqError as exc:
            pytest.skip(
                f"no asyncq test database: give --asyncq-dsn or ${ENV}, or install"
                f" asyncq[embedded]: {exc}"
            )
    try:
        with psycopg.connect(dsn, connect_timeout=10):
            pass
    except psycopg.OperationalError as exc:
        pytest.skip(f"asyncq test database unreachable: {' '.join(str(exc).split())}")
    return dsn


@pytest.fixture(scope="session")
def asyncq_schema(asyncq_dsn: str) -> Iterator[str]:
    """This session's test schema, migrated; dropped after the session."""
    name = f"asyncq_test_{os.getpid()}_{secrets.token_hex(3)}"

    async def make() -> None:
        async with (
            await psycopg.AsyncConnection.connect(asyncq_dsn, autocommit=True) as conn,
            await psycopg.AsyncConnection.connect(asyncq_dsn, autocommit=True) as lock,
        ):
            # With the index of limited tasks: one schema serves any App.
            await migrate.apply(conn, name, lock=lock, ready_by_task=True)

    anyio.run(make)
    try:
        yield name
    finally:
        with psycopg.connect(asyncq_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def asyncq_app() -> App:
    """The App under test: override this fixture to return yours (closed)."""
    return App()


@pytest.fixture
async def asyncq_test_app(
    asyncq_app: App, asyncq_dsn: str, asyncq_schema: str, anyio_backend: object
) -> AsyncIterator[App]:
    """``asyncq_app`` bound to the empty test schema, open; restored after the test."""
    app = asyncq_app
    if app.is_open:
        raise AsyncqError(
            "the asyncq_app fixture returned an open App: return it closed, and the"
            " asyncq_test_app fixture opens it on the test schema"
        )
    saved_dsn, saved_schema = app.dsn_argument, app.schema
    app.rebind(dsn=asyncq_dsn, schema=asyncq_schema)
    try:
        async with app:
            async with app.writer.connection() as conn:
                await app.store.testing_empty(conn)
            yield app
    finally:
        app.rebind(dsn=saved_dsn, schema=saved_schema)
