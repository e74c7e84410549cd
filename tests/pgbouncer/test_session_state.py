"""What transaction pooling breaks, and that asyncq keeps none of it.

The PgBouncer here gives one client's transactions to whichever server connection is
free, so anything a client leaves in a session (a setting, a prepared statement, a lock)
stays with a server connection that other clients use next.
"""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq.store import IDLE_LIMIT, Store
from tests.harness import pgbouncer
from tests.harness.pgbouncer import PgBouncer
from tests.pgbouncer.conftest import bounced_app, start

pytestmark = pytest.mark.anyio


def pgbouncer_version() -> tuple[int, ...]:
    found = pgbouncer.binary()
    return pgbouncer.version(found) if found else (0,)


VERSION = pgbouncer_version()
SETTINGS = ("idle_in_transaction_session_timeout", "plan_cache_mode", "search_path")


def server_settings(bouncer: PgBouncer, dsn: str) -> dict[int, tuple[str, ...]]:
    """The SETTINGS of every server connection of the pool, by backend pid: as many
    clients as the pool has server connections each hold a transaction, so that each
    runs on a server connection of its own."""
    seen: dict[int, tuple[str, ...]] = {}
    clients = [
        psycopg.connect(bouncer.through(dsn), prepare_threshold=None)
        for _ in range(bouncer.pool_size)
    ]
    try:
        for conn in clients:  # each BEGINs and keeps its server connection
            row = conn.execute(
                "SELECT pg_backend_pid(), "
                + ", ".join(f"current_setting('{name}')" for name in SETTINGS)
            ).fetchone()
            assert row is not None
            seen[row[0]] = tuple(row[1:])
    finally:
        for conn in clients:
            conn.close()
    assert len(seen) == bouncer.pool_size
    return seen


def test_one_client_runs_on_several_server_connections(bouncer: PgBouncer, dsn: str) -> None:
    """The fixture is in transaction mode: a client's next transaction may run on another
    server connection, as soon as its last one is taken by someone else."""
    seen: set[int] = set()
    with (
        psycopg.connect(bouncer.through(dsn), autocommit=True, prepare_threshold=None) as mine,
        psycopg.connect(bouncer.through(dsn), prepare_threshold=None) as other,
    ):
        for _ in range(20):
            row = mine.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            seen.add(row[0])
            if len(seen) > 1:
                break
            other.execute("SELECT 1")  # a transaction that holds a server connection
            row = mine.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            seen.add(row[0])
            other.rollback()
    assert len(seen) > 1


@pytest.mark.skipif(
    VERSION >= (1, 21), reason="PgBouncer 1.21+ may keep prepared statements (by its settings)"
)
def test_prepared_statements_break_without_prepare_threshold_none(
    bouncer: PgBouncer, dsn: str
) -> None:
    """Why ``App(prepare_threshold=None)`` behind a PgBouncer before 1.21 (or without
    ``max_prepared_statements``): psycopg prepares a statement on its sixth run on a
    connection, in the server session that runs it, and runs it by name after that, in
    whichever session the next transaction gets."""
    clients = [
        psycopg.connect(bouncer.through(dsn), autocommit=True) for _ in range(bouncer.pool_size + 2)
    ]
    try:
        with pytest.raises(
            (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)
        ):
            for n in range(20):
                for conn in clients:
                    conn.execute("SELECT %s::int", (n,))
    finally:
        for conn in clients:
            conn.close()
    clients = [
        psycopg.connect(bouncer.through(dsn), autocommit=True, prepare_threshold=None)
        for _ in range(bouncer.pool_size + 2)
    ]
    try:
        for n in range(20):
            for conn in clients:
                assert conn.execute("SELECT %s::int", (n,)).fetchone() == (n,)
    finally:
        for conn in clients:
            conn.close()


@pytest.mark.skipif(VERSION < (1, 22), reason="psycopg's prepared statements need PgBouncer 1.22+")
async def test_with_max_prepared_statements_the_default_threshold_works(
    pgbouncer_binary: str, server_dsn: str, throwaway_dsn: str
) -> None:
    """PgBouncer 1.22+ with ``max_prepared_statements`` keeps psycopg's prepared
    statements (closed at the protocol level, as psycopg does with libpq 17+, or all at
    once by DEALLOCATE ALL after a rollback or DDL): asyncq's default
    ``prepare_threshold`` works through it, migrations included."""
    bouncer = start(pgbouncer_binary, server_dsn, max_prepared_statements=200)
    try:
        app = asyncq.App(bouncer.through(throwaway_dsn), listen_dsn=throwaway_dsn)
        ran: list[int] = []

        @app.task(name="pgb.prepared")
        async def work(n: int) -> None:
            ran.append(n)

        async with app:
            await app.migrate()
            for n in range(20):
                await work.defer(n)
            await work.defer_many([{"n": n} for n in range(20, 40)])
            with anyio.fail_after(30):
                await app.run_worker(drain=True, handle_signals=False, concurrency=4)
        assert sorted(ran) == list(range(40))
    finally:
        bouncer.close()


async def test_a_worker_leaves_no_setting_on_the_server_connections(
    bouncer: PgBouncer, dsn: str, db: Any
) -> None:
    """A worker with everything that opens a transaction (limits, a schedule, maintenance
    passes, outcomes of several kinds in one batch) bounds each transaction's idle time
    and plans for that transaction only: no server connection keeps a setting."""
    before = server_settings(bouncer, dsn)
    app = bounced_app(bouncer, dsn)
    ran: list[int] = []

    @app.task(name="pgb.limited", concurrency=2, max_attempts=1)
    async def limited(n: int) -> None:
        ran.append(n)
        if n % 3 == 0:
            raise RuntimeError("on purpose")

    @app.periodic(cron="* * * * *", name="pgb.tick")
    async def tick() -> None:
        pass

    async with app:
        await limited.defer_many([{"n": n} for n in range(30)])
        with anyio.fail_after(30):
            await app.run_worker(drain=True, handle_signals=False, concurrency=4)
    assert sorted(ran) == list(range(30))
    after = server_settings(bouncer, dsn)
    assert set(after.values()) == set(before.values()), after
    for idle, plan, _path in after.values():
        assert (idle, plan) == ("0", "auto")


async def test_a_workers_transactions_bound_their_idle_time(bouncer: PgBouncer, dsn: str) -> None:
    """The statement that opens a worker's transaction sets its idle limit for that
    transaction; the next transaction, on whatever server connection, has none."""
    app = bounced_app(bouncer, dsn)
    async with (
        app,
        await psycopg.AsyncConnection.connect(
            bouncer.through(dsn), autocommit=True, prepare_threshold=None
        ) as conn,
    ):

        async def idle_limit() -> Any:
            return await (await conn.execute("SHOW idle_in_transaction_session_timeout")).fetchone()

        for begin in (
            lambda: app.store.try_lock(conn, name="pgb.test", schema="public"),
            lambda: app.store.limit_idle(conn),
        ):
            async with conn.transaction():
                await begin()
                assert await idle_limit() == (IDLE_LIMIT,)
            assert await idle_limit() == ("0",)


async def test_the_look_at_a_claim_finds_its_statement_by_application_name(
    bounced_dsn: str,
) -> None:
    """Behind PgBouncer the process id a client is told is PgBouncer's own: the look at a
    claim with no answer (`Store.at_work`) finds a statement the server runs for it by
    its application_name, which PgBouncer sets on the server connection."""
    store = Store()
    name = "asyncq:test:look"
    options: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    async with (
        await psycopg.AsyncConnection.connect(
            bounced_dsn, application_name=name, **options
        ) as busy,
        await psycopg.AsyncConnection.connect(bounced_dsn, **options) as looking,
    ):
        pid = busy.info.backend_pid
        async with anyio.create_task_group() as tg:
            tg.start_soon(busy.execute, "SELECT pg_sleep(2)")
            with anyio.fail_after(10):
                while not await store.at_work(looking, pid=pid, application_name=name):  # noqa: ASYNC110 - the server's state
                    await anyio.sleep(0.01)
            assert not await store.at_work(looking, pid=pid, application_name="asyncq:nobody")
