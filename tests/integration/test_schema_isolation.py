"""Apps with App(schema=...) in one database never see each other's jobs or wake-ups.

Every App here registers a task under the same name, so a worker that read another
schema's rows would run them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import asyncq
from asyncq.migrate import migrations
from tests.harness.listening import Listening
from tests.harness.waiting import WITHIN, until

pytestmark = pytest.mark.anyio

ALL_VERSIONS = [m.version for m in migrations()]
SCHEMAS = ("tenant_a", "tenant_b", None)  # None: the connection's current schema (public)
NAME = "shared.work"


class Tenant:
    def __init__(self, dsn: str, schema: str | None) -> None:
        self.label = schema or "public"
        self.app = asyncq.App(dsn, schema=schema)
        self.ran: list[int] = []

        @self.app.task(name=NAME, max_attempts=1)
        async def work(n: int) -> None:
            if n < 0:
                raise RuntimeError("negative")
            self.ran.append(n)

        self.work = work

    async def until_ran(self, expected: list[int], within: float = WITHIN) -> None:
        await until(lambda: sorted(self.ran) == expected, within, f"{self.label} to run {expected}")

    async def drain(self) -> asyncq.WorkerStats:
        with anyio.fail_after(20):
            return await self.app.run_worker(drain=True, handle_signals=False)


def rows(db: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT id, (args->>'n')::int, status::text FROM {} ORDER BY id").format(
        sql.Identifier(schema, "asyncq_jobs")
    )
    return db.execute(query).fetchall()


@pytest.fixture
async def tenants(throwaway_dsn: str) -> AsyncIterator[dict[str, Tenant]]:
    """Three migrated, open Apps on one new database: tenant_a, tenant_b and public."""
    made = {t.label: t for t in (Tenant(throwaway_dsn, schema) for schema in SCHEMAS)}
    async with AsyncExitStack() as stack:
        for tenant in made.values():
            await stack.enter_async_context(tenant.app)
            assert await tenant.app.migrate() == ALL_VERSIONS
        yield made


@pytest.fixture
def tdb(throwaway_dsn: str) -> Any:
    with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
        yield conn


async def test_each_app_migrates_into_its_own_schema(throwaway_dsn: str, tdb: Any) -> None:
    a = Tenant(throwaway_dsn, "tenant_a")
    async with a.app:
        assert await a.app.migrate() == ALL_VERSIONS
        assert await a.app.migrate() == []
    tables = tdb.execute(
        "SELECT table_schema, table_name FROM information_schema.tables"
        " WHERE table_name LIKE 'asyncq%' ORDER BY 1, 2"
    ).fetchall()
    assert {schema for schema, _ in tables} == {"tenant_a"}
    assert {"asyncq_jobs", "asyncq_migrations", "asyncq_queues", "asyncq_schedules"} <= {
        name for _, name in tables
    }
    # The type, the functions and the triggers live there too.
    types = tdb.execute(
        "SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
        " WHERE t.typname = 'asyncq_job_status'"
    ).fetchall()
    assert types == [("tenant_a",)]


async def test_a_worker_runs_only_its_own_apps_jobs(tenants: dict[str, Tenant], tdb: Any) -> None:
    a, b, public = tenants["tenant_a"], tenants["tenant_b"], tenants["public"]
    await a.work.defer(1)
    await b.work.defer(2)
    await public.work.defer(3)
    await a.work.defer_many([{"n": 11}, {"n": 12}])
    # unique keys are per schema too
    await a.work.options(unique_key="nightly").defer(13)
    await b.work.options(unique_key="nightly").defer(23)

    stats = await a.drain()
    assert sorted(a.ran) == [1, 11, 12, 13]
    assert stats.claimed == 4
    assert b.ran == [] and public.ran == []
    assert [r[2] for r in rows(tdb, "tenant_b")] == ["queued", "queued"]
    assert [r[2] for r in rows(tdb, "public")] == ["queued"]

    await b.drain()
    await public.drain()
    assert sorted(b.ran) == [2, 23]
    assert public.ran == [3]
    assert sorted(a.ran) == [1, 11, 12, 13]


async def test_a_defer_on_the_callers_connection_lands_in_the_apps_schema(
    tenants: dict[str, Tenant], throwaway_dsn: str, tdb: Any
) -> None:
    a, b = tenants["tenant_a"], tenants["tenant_b"]
    async with await psycopg.AsyncConnection.connect(throwaway_dsn) as conn:
        path = await (await conn.execute("SHOW search_path")).fetchone()
        assert path == ('"$user", public',)  # the default: tenant_a is not on it
        async with conn.transaction():
            a_id = await a.work.options(conn=conn).defer(7)
            b_id = await b.work.options(conn=conn).defer(8)
            assert rows(tdb, "tenant_a") == []  # not committed yet
    assert rows(tdb, "tenant_a") == [(a_id, 7, "queued")]
    assert rows(tdb, "tenant_b") == [(b_id, 8, "queued")]
    assert rows(tdb, "public") == []


async def test_requeue_touches_only_its_own_schema(tenants: dict[str, Tenant], tdb: Any) -> None:
    a, b = tenants["tenant_a"], tenants["tenant_b"]
    a_id = await a.work.defer(-1)
    b_id = await b.work.defer(-1)
    assert a_id == b_id  # the same id, in two tables
    await a.drain()
    await b.drain()
    assert rows(tdb, "tenant_a") == rows(tdb, "tenant_b") == [(a_id, -1, "failed")]

    result = await a.app.requeue([a_id])
    assert result.requeued == [a_id]
    assert rows(tdb, "tenant_a") == [(a_id, -1, "queued")]
    assert rows(tdb, "tenant_b") == [(b_id, -1, "failed")]
    assert (await b.app.requeue(queues=["other"])).requeued == []
    assert rows(tdb, "tenant_b") == [(b_id, -1, "failed")]


async def test_wake_ups_go_to_the_schemas_own_channel(
    tenants: dict[str, Tenant], throwaway_dsn: str, tdb: Any
) -> None:
    a, b, public = tenants["tenant_a"], tenants["tenant_b"], tenants["public"]
    async with await psycopg.AsyncConnection.connect(throwaway_dsn, autocommit=True) as listener:
        for channel in ("asyncq.tenant_a", "asyncq.tenant_b", "asyncq.public"):
            await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

        async def heard() -> list[tuple[str, str]]:
            return [(n.channel, n.payload) async for n in listener.notifies(timeout=0.2)]

        await a.work.options(queue="qa").defer(1)
        assert await heard() == [("asyncq.tenant_a", "qa")]
        # A job due later says when: the queue, a unit separator, the milliseconds.
        await a.work.options(queue="qa", delay=5).defer(1)
        [(channel, payload)] = await heard()
        queue, separator, ms = payload.partition("\x1f")
        assert (channel, queue, separator) == ("asyncq.tenant_a", "qa", "\x1f")
        assert 4900 <= int(ms) <= 5001
        await b.work.options(queue="qb").defer(2)
        assert await heard() == [("asyncq.tenant_b", "qb")]
        tdb.execute("INSERT INTO tenant_b.asyncq_jobs (task_name, queue) VALUES ('x', 'sql')")
        assert await heard() == [("asyncq.tenant_b", "sql")]
        await public.work.defer(3)
        assert await heard() == [("asyncq.public", "default")]
        # A retry, a requeue or a reaped job wakes workers of its own schema only, too.
        tdb.execute("UPDATE tenant_a.asyncq_jobs SET status = 'failed'")
        assert await heard() == []
        await a.app.requeue(queues=["qa"])
        assert await heard() == [("asyncq.tenant_a", "qa")]


async def test_a_waiting_worker_is_woken_by_its_own_apps_jobs_only(
    tenants: dict[str, Tenant], tdb: Any
) -> None:
    a, b = tenants["tenant_a"], tenants["tenant_b"]
    listening = Listening(a.app)
    # Written before the worker listens: its notification wakes nothing later.
    await a.work.defer(1)
    async with anyio.create_task_group() as tg:
        # Polls once a minute: within this test, only a notification makes it claim.
        tg.start_soon(lambda: a.app.run_worker(poll_interval=60, handle_signals=False))
        await a.until_ran([1])
        await listening.until_listening()
        # The claim that the listener's connecting sets off cannot be seen from here: it
        # goes out within a turn or two of the worker's loop, and would take the silent
        # job below. Leave it ample time.
        await anyio.sleep(1.0)

        # A ready job written without a notification (triggers off for this session):
        # only a wake-up of A's own gets it claimed before the next poll.
        tdb.execute("SET session_replication_role = replica")
        (silent,) = tdb.execute(
            "INSERT INTO tenant_a.asyncq_jobs (task_name, args) VALUES (%s, '{\"n\": 2}')"
            " RETURNING id",
            (NAME,),
        ).fetchone()
        tdb.execute("SET session_replication_role = DEFAULT")
        # A window for a wrong wake-up to show: no claim may take the silent job in it.
        await anyio.sleep(0.5)
        await b.work.defer(20)  # B's insert notifies B's channel, not A's
        await anyio.sleep(0.7)
        assert a.ran == [1]
        assert rows(tdb, "tenant_a")[1] == (silent, 2, "queued")

        await a.work.defer(3)  # A's insert wakes A's worker, which claims both
        await a.until_ran([1, 2, 3])  # well before the next poll, a minute away
        tg.cancel_scope.cancel()
    assert b.ran == []
    assert [r[2] for r in rows(tdb, "tenant_b")] == ["queued"]


@pytest.mark.parametrize(
    "schema",
    [
        "Tenant_A",  # uppercase
        'tenant"a',  # quotes
        "tenant'a",
        "a" * 51,  # too long for the wake-up channel name
        "",
        "1tenant",
        "tenant-a",
        "tenant a",
        "tenant.a",
        "tenant_a\n",
        "pg_tenant",  # PostgreSQL reserves pg_
    ],
)
def test_a_bad_schema_name_is_refused_at_app(schema: str) -> None:
    with pytest.raises(asyncq.ConfigurationError, match="schema"):
        asyncq.App("postgresql://nowhere/db", schema=schema)


@pytest.mark.parametrize("schema", ["a" * 50, "tenant_1", "_private", "public"])
def test_good_schema_names_are_accepted(schema: str) -> None:
    assert asyncq.App("postgresql://nowhere/db", schema=schema).schema == schema


async def test_a_current_schema_with_the_longest_name_postgresql_allows(
    throwaway_dsn: str, tdb: Any
) -> None:
    # 63 bytes: "asyncq." and the name do not fit a channel name of 63 bytes.
    schema = "tenant_" + "x" * 56
    tdb.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    app = asyncq.App(f"{throwaway_dsn} options=-csearch_path={schema}")
    ran: list[int] = []

    @app.task(name=NAME)
    async def work(n: int) -> None:
        ran.append(n)

    listening = Listening(app)
    async with app:
        await app.migrate()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: app.run_worker(poll_interval=60, handle_signals=False))
            await listening.until_listening()
            await work.defer(1)
            await work.defer_many([{"n": 2}, {"n": 3}])
            await until(lambda: sorted(ran) == [1, 2, 3], what="the jobs to run")
            tg.cancel_scope.cancel()
    assert rows(tdb, schema) == [(1, 1, "done"), (2, 2, "done"), (3, 3, "done")]
