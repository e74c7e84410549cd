"""Migrations through PgBouncer in transaction mode: from an empty database, racing, in
a schema of their own; the migration lock is released whatever server connection took
it, and still excludes a migrator of an earlier version (a session lock, straight to
the server)."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

from asyncq.migrate import migrations
from tests.harness.pgbouncer import PgBouncer
from tests.harness.waiting import until
from tests.pgbouncer.conftest import advisory_locks, bounced_app

pytestmark = pytest.mark.anyio

ALL_VERSIONS = [m.version for m in migrations()]
# The key of the migration lock of schema public, as every version of asyncq takes it.
PUBLIC_LOCK = "SELECT pg_advisory_lock(hashtext('asyncq.migrate.public'))"
PUBLIC_UNLOCK = "SELECT pg_advisory_unlock(hashtext('asyncq.migrate.public'))"


def tables(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT table_schema, table_name FROM information_schema.tables"
        " WHERE table_name LIKE 'asyncq%' ORDER BY 1, 2"
    ).fetchall()


def versions(conn: psycopg.Connection[Any], schema: str) -> list[int]:
    query = sql.SQL("SELECT version FROM {} ORDER BY 1").format(
        sql.Identifier(schema, "asyncq_migrations")
    )
    return [r[0] for r in conn.execute(query)]


def invalid_indexes(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT indexrelid::regclass FROM pg_index WHERE NOT indisvalid").fetchall()


async def test_migrate_an_empty_database(bouncer: PgBouncer, throwaway_dsn: str) -> None:
    async with bounced_app(bouncer, throwaway_dsn) as app:
        assert await app.migrate() == ALL_VERSIONS
        assert await app.migrate() == []
        ran: list[int] = []

        @app.task(name="pgb.after_migrate")
        async def job(n: int) -> None:
            ran.append(n)

        await job.defer(7)
        with anyio.fail_after(20):
            await app.run_worker(drain=True, handle_signals=False)
        assert ran == [7]
    with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
        assert versions(conn, "public") == ALL_VERSIONS
        assert {schema for schema, _ in tables(conn)} == {"public"}
        assert invalid_indexes(conn) == []
        assert advisory_locks(conn) == []  # the lock went with its transaction
        # The index migration 0004 builds CONCURRENTLY, under the lock's transaction.
        row = conn.execute("SELECT to_regclass('public.asyncq_jobs_ended') IS NOT NULL")
        assert row.fetchone() == (True,)


async def test_racing_migrators_apply_each_version_once(
    bouncer: PgBouncer, throwaway_dsn: str
) -> None:
    """Three rounds (the current schema, then two schemas of their own) of three
    migrators at once, every one through PgBouncer's two server connections."""
    for schema in (None, "race_a", "race_b"):
        results: list[list[int]] = []

        async def migrate_once(
            schema: str | None = schema, results: list[list[int]] = results
        ) -> None:
            async with bounced_app(bouncer, throwaway_dsn, schema=schema, pool_min_size=0) as app:
                results.append(await app.migrate())

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(migrate_once)
        assert sorted(results) == [[], [], ALL_VERSIONS], schema
        with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
            assert versions(conn, schema or "public") == ALL_VERSIONS
            assert advisory_locks(conn) == []
    with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
        found = tables(conn)
        assert {schema for schema, _ in found} == {"public", "race_a", "race_b"}
        assert len(found) == 3 * len([n for s, n in found if s == "public"])
        assert invalid_indexes(conn) == []


async def test_migrating_a_schema_leaves_the_server_connections_search_path(
    bouncer: PgBouncer, throwaway_dsn: str
) -> None:
    async with bounced_app(bouncer, throwaway_dsn, schema="tenant_a") as app:
        assert await app.migrate() == ALL_VERSIONS
    through = bouncer.through(throwaway_dsn)
    clients = [psycopg.connect(through, prepare_threshold=None) for _ in range(bouncer.pool_size)]
    try:  # each holds a transaction: each shows another server connection's search_path
        paths = {c.execute("SHOW search_path").fetchone() for c in clients}
    finally:
        for c in clients:
            c.close()
    assert paths == {('"$user", public',)}
    with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
        assert {schema for schema, _ in tables(conn)} == {"tenant_a"}
        assert versions(conn, "tenant_a") == ALL_VERSIONS
        row = conn.execute("SELECT to_regclass('tenant_a.asyncq_jobs_ended') IS NOT NULL")
        assert row.fetchone() == (True,)


async def test_a_migrator_waits_for_the_session_lock_of_an_earlier_version(
    bouncer: PgBouncer, throwaway_dsn: str
) -> None:
    applied: list[list[int]] = []
    with psycopg.connect(throwaway_dsn, autocommit=True) as earlier:
        earlier.execute(PUBLIC_LOCK)  # as a migrator of an earlier version holds it
        async with bounced_app(bouncer, throwaway_dsn) as app, anyio.create_task_group() as tg:

            async def migrate() -> None:
                applied.append(await app.migrate())

            tg.start_soon(migrate)
            await anyio.sleep(1.0)  # a window for the migrator to go ahead: it must not
            assert applied == []
            with psycopg.connect(throwaway_dsn) as conn:
                assert tables(conn) == []
            earlier.execute(PUBLIC_UNLOCK)
            await until(lambda: applied, what="the migration, once the lock is free")
    assert applied == [ALL_VERSIONS]
