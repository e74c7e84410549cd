"""Any server encoding works: LATIN1, a Cyrillic one, and SQL_ASCII (no encoding at all)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import asyncq

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)


@contextmanager
def database_in(server_dsn: str, encoding: str) -> Iterator[str]:
    """A new database in ``encoding`` on the test server, dropped afterwards."""
    name = f"asyncq_enc_{encoding.lower()}_{secrets.token_hex(3)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING '{encoding}'"
            " LC_COLLATE 'C' LC_CTYPE 'C'"
        )
    try:
        yield make_conninfo(**{**conninfo_to_dict(server_dsn), "dbname": name})
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["LATIN1", "WIN1251", "SQL_ASCII"])
def encoded_dsn(request: pytest.FixtureRequest, server_dsn: str) -> Iterator[str]:
    with database_in(server_dsn, request.param) as dsn:
        yield dsn


STORABLE = {"LATIN1": "café", "WIN1251": "Жук", "SQL_ASCII": "名前 ✓"}


async def test_a_worker_runs_and_records_errors_on_any_server_encoding(
    encoded_dsn: str, request: pytest.FixtureRequest
) -> None:
    encoding = request.node.callspec.params["encoded_dsn"]
    app = asyncq.App(encoded_dsn)
    seen: list[str] = []

    @app.task(name="encodings.echo")
    async def echo(text: str) -> None:
        seen.append(text)

    @app.task(name="encodings.fails", max_attempts=2, retry=AT_ONCE)
    async def fails() -> None:
        # Characters that LATIN1 and WIN1251 lack, in the message and in the traceback.
        raise RuntimeError("naïve ✓ 名前 — Ж failed")

    async with app:
        await app.migrate()
        await echo.defer("plain ascii")
        await echo.defer(STORABLE[encoding])
        failing = await fails.defer()
        stats = await app.run_worker(drain=True, handle_signals=False)
    assert sorted(seen) == sorted(["plain ascii", STORABLE[encoding]])
    assert stats.done == 2 and stats.failed_attempts == 2
    with psycopg.connect(encoded_dsn, autocommit=True, client_encoding="utf8") as conn:
        row = conn.execute(
            "SELECT status::text, attempts, last_error FROM asyncq_jobs WHERE id = %s", (failing,)
        ).fetchone()
    assert row is not None
    status, attempts, last_error = row
    assert (status, attempts) == ("failed", 2)
    assert isinstance(last_error, str) and last_error.startswith("RuntimeError: na")
    assert last_error.splitlines()[0].endswith("failed")


async def test_arguments_the_encoding_cannot_hold_are_refused_clearly(server_dsn: str) -> None:
    with database_in(server_dsn, "LATIN1") as dsn:
        app = asyncq.App(dsn)

        @app.task(name="encodings.echo")
        async def echo(text: str) -> None:
            pass

        async with app:
            await app.migrate()
            with pytest.raises(psycopg.DataError, match="LATIN1"):
                await echo.defer("名前")
            assert await echo.defer("café") > 0
