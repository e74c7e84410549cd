"""Apps with App(schema=...) in one database, through PgBouncer in transaction mode: every
query names its schema, so nothing depends on a server connection's search_path, and
none is left changed. Every App registers a task under the same name, so a worker that
read another schema's rows would run them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import asyncq
from asyncq.migrate import migrations
from tests.harness.listening import Listening
from tests.harness.pgbouncer import PgBouncer
from tests.harness.waiting import until
from tests.pgbouncer.conftest import bounced_app

pytestmark = pytest.mark.anyio

ALL_VERSIONS = [m.version for m in migrations()]
NAME = "shared.work"


class Tenant:
    def __init__(self, bouncer: PgBouncer, dsn: str, schema: str | None) -> None:
        self.label = schema or "public"
        self.app = bounced_app(bouncer, dsn, schema=schema)
        self.ran: list[int] = []

        @self.app.task(name=NAME, max_attempts=1, concurrency=5)  # a limit: its index too
        async def work(n: int) -> None:
            self.ran.append(n)

        self.work = work

    async def drain(self) -> asyncq.WorkerStats:
        with anyio.fail_after(20):
            return await self.app.run_worker(drain=True, handle_signals=False)


def rows(db: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT id, (args->>'n')::int, status::text FROM {} ORDER BY id").format(
        sql.Identifier(schema, "asyncq_jobs")
    )
    return db.execute(query).fetchall()


@pytest.fixture
async def tenants(bouncer: PgBouncer, throwaway_dsn: str) -> AsyncIterator[dict[str, Tenant]]:
    """Three migrated, open Apps through PgBouncer: tenant_a, tenant_b and public."""
    made = {
        t.label: t
        for t in (Tenant(bouncer, throwaway_dsn, s) for s in ("tenant_a", "tenant_b", None))
    }
    async with AsyncExitStack() as stack:
        for tenant in made.values():
            await stack.enter_async_context(tenant.app)
            assert await tenant.app.migrate() == ALL_VERSIONS
        yield made


@pytest.fixture
def tdb(throwaway_dsn: str) -> Any:
    with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
        yield conn


async def test_each_schema_is_migrated_whole(tenants: dict[str, Tenant], tdb: Any) -> None:
    for schema in ("tenant_a", "tenant_b", "public"):
        found = tdb.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname IN ('asyncq_jobs_ended',"
            " 'asyncq_jobs_ready_by_task')",
            (schema,),
        ).fetchone()
        assert found == (2,), schema  # the indexes built CONCURRENTLY, in the schema
        assert rows(tdb, schema) == []


async def test_a_worker_runs_only_its_own_apps_jobs(
    tenants: dict[str, Tenant], bouncer: PgBouncer, throwaway_dsn: str, tdb: Any
) -> None:
    a, b, public = tenants["tenant_a"], tenants["tenant_b"], tenants["public"]
    await a.work.defer(1)
    await b.work.defer(2)
    await public.work.defer(3)
    await a.work.defer_many([{"n": 11}, {"n": 12}])
    await a.work.options(unique_key="nightly").defer(13)
    await b.work.options(unique_key="nightly").defer(23)
    async with (
        await psycopg.AsyncConnection.connect(
            bouncer.through(throwaway_dsn), prepare_threshold=None
        ) as conn,
        conn.transaction(),
    ):  # the caller's own connection: the App's schema
        await a.work.options(conn=conn).defer(14)

    stats = await a.drain()
    assert sorted(a.ran) == [1, 11, 12, 13, 14]
    assert stats.claimed == 5
    assert b.ran == [] and public.ran == []
    assert [r[2] for r in rows(tdb, "tenant_b")] == ["queued", "queued"]
    await b.drain()
    await public.drain()
    assert sorted(b.ran) == [2, 23]
    assert public.ran == [3]


async def test_a_waiting_worker_is_woken_by_its_own_apps_jobs(
    tenants: dict[str, Tenant], tdb: Any
) -> None:
    a, b = tenants["tenant_a"], tenants["tenant_b"]
    listening = Listening(a.app)
    async with anyio.create_task_group() as tg:
        # Polls once a minute: only a notification, on its LISTEN straight to the
        # server, makes it claim.
        tg.start_soon(partial(a.app.run_worker, poll_interval=60, handle_signals=False))
        await listening.until_listening()
        await b.work.defer(20)
        await anyio.sleep(0.5)  # a window for a wrong wake-up to show: none may
        assert a.ran == []
        await a.work.defer(1)
        await until(lambda: a.ran == [1], what="A's job to run, well before the next poll")
        tg.cancel_scope.cancel()
    assert b.ran == []
    assert [r[2] for r in rows(tdb, "tenant_b")] == ["queued"]


async def test_a_current_schema_chosen_by_the_databases_search_path(
    bouncer: PgBouncer, throwaway_dsn: str, tdb: Any
) -> None:
    """Without App(schema=...), the jobs live in the current schema: through PgBouncer,
    one the server gives every session (ALTER DATABASE/ROLE ... SET search_path), as
    the DSN's ``options`` cannot (PgBouncer refuses them)."""
    tdb.execute("CREATE SCHEMA jobs_here")
    database = tdb.info.dbname
    tdb.execute(
        sql.SQL("ALTER DATABASE {} SET search_path = jobs_here").format(sql.Identifier(database))
    )
    refused = asyncq.App(
        f"{bouncer.through(throwaway_dsn)} options=-csearch_path=jobs_here",
        listen_dsn=throwaway_dsn,
        prepare_threshold=None,
    )
    with pytest.raises(asyncq.DatabaseUnavailable, match="unsupported startup parameter: options"):
        await refused.open()

    app = bounced_app(bouncer, throwaway_dsn)
    listening = Listening(app)
    ran: list[int] = []

    @app.task(name=NAME)
    async def work(n: int) -> None:
        ran.append(n)

    async with app, anyio.create_task_group() as tg:
        assert await app.migrate() == ALL_VERSIONS
        tg.start_soon(partial(app.run_worker, poll_interval=60, handle_signals=False))
        await listening.until_listening()  # on the channel of jobs_here
        await work.defer(1)
        await work.defer_many([{"n": 2}, {"n": 3}])
        await until(lambda: sorted(ran) == [1, 2, 3], what="the jobs to run")
        tg.cancel_scope.cancel()
    assert rows(tdb, "jobs_here") == [(1, 1, "done"), (2, 2, "done"), (3, 3, "done")]
    tables = tdb.execute(
        "SELECT DISTINCT table_schema FROM information_schema.tables"
        " WHERE table_name LIKE 'asyncq%'"
    ).fetchall()
    assert tables == [("jobs_here",)]
