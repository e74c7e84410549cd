"""Apply ``sql/migrations/NNNN_name.sql`` in order, once each, under an advisory lock.

Each migration runs in its own transaction together with its row in
``asyncq_migrations``, so a failed migration leaves nothing half done, and
concurrent ``asyncq migrate`` runs wait for each other instead of racing.

A migration whose first line is ``-- asyncq: no transaction`` runs statement by
statement outside a transaction instead, for ``CREATE INDEX CONCURRENTLY`` (an index
built while workers go on writing). Its statements are idempotent (``IF NOT EXISTS``);
an index left invalid by an interrupted build is dropped before it runs again.

Nothing here lives in the session, so that migrations work through a PgBouncer in
transaction mode, where each transaction may run on another server connection:

- The lock is a transaction-level advisory lock, held by a transaction of its own on a
  second connection (``lock``) for as long as the migrations run, and released by its
  rollback. A session's lock could be taken on one server connection and "released" on
  another, and stay held for ever. The key is the one a session lock of earlier
  versions took, so a migrator of an earlier version and one of this version still
  wait for each other.
- With a schema, each transaction sets its ``search_path`` with ``SET LOCAL``, and the
  statements run outside a transaction name their tables with the schema.

The lock's transaction holds no snapshot between its statements (READ COMMITTED, and
its keep-alive is a ``SHOW``, which takes none), so a ``CREATE INDEX CONCURRENTLY`` run
under it, which waits for the transactions that hold older snapshots, never waits for
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

import anyio
import psycopg
from psycopg import AsyncConnection, IsolationLevel, sql

from asyncq.errors import SchemaNotMigrated

logger = logging.getLogger(__name__)

Conn = AsyncConnection[Any]

# Taken by polling, not by waiting in pg_advisory_xact_lock: a session waiting there
# holds a snapshot, which a CREATE INDEX CONCURRENTLY of the lock's holder would wait for.
_TRY_LOCK = (
    "SELECT pg_try_advisory_xact_lock("
    "hashtext('asyncq.migrate.' || coalesce(%s::text, current_schema())))"
)
_LOCK_POLL = 0.05
# The lock's transaction is idle while the migrations run: the server's timeout for idle
# transactions must not end it, and a pooler's must not either (the keep-alive).
_NO_IDLE_TIMEOUT = "SET LOCAL idle_in_transaction_session_timeout = 0"
_KEEP_ALIVE = "SHOW server_version"
KEEP_ALIVE_EVERY = 1.0
_SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)"
_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {}"
_USE_SCHEMA = "SET LOCAL search_path TO {}"
_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS asyncq_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
_APPLIED = "SELECT version FROM asyncq_migrations"
_RECORD = "INSERT INTO asyncq_migrations (version, name) VALUES (%s, %s)"
_HAS_VERSIONS = "SELECT to_regclass(format('%%I.asyncq_migrations', %s::text)) IS NOT NULL"
_CURRENT = "SELECT coalesce(max(version), 0) FROM {}"
_INVALID_INDEXES = """
SELECT format('%I.%I', n.nspname, c.relname)
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE NOT i.indisvalid AND i.indrelid = 'asyncq_jobs'::regclass"""
NO_TRANSACTION = "-- asyncq: no transaction"
# The claim of limited tasks finds a task's ready jobs through this index. Every insert
# pays for it (a quarter of a bulk insert's speed, measured), so it is made only for an
# App that declares limits; built CONCURRENTLY, as workers go on.
_READY_BY_TASK = """
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_jobs_ready_by_task
    ON asyncq_jobs (task_name, priority DESC, run_at, id) WHERE status = 'queued'"""
# The names a statement outside a transaction may hold, outside string literals; and the
# name of an index it creates, which takes no schema (the index goes in its table's).
_OBJECTS = re.compile(r"(?<!')\b(asyncq_[a-z_]+)\b(?!')")
_CREATED_INDEX = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?"
    r"(asyncq_[a-z_]+)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def transactional(self) -> bool:
        return not self.sql.startswith(NO_TRANSACTION)

    def statements(self, schema: str | None = None) -> list[str]:
        """The statements of a migration that runs outside a transaction; with
        ``schema``, the tables they name are named with it."""
        lines = [line for line in self.sql.splitlines() if not line.lstrip().startswith("--")]
        parts = [part.strip() for part in "\n".join(lines).split(";") if part.strip()]
        return parts if schema is None else [_qualified(part, schema) for part in parts]


def _qualified(statement: str, schema: str) -> str:
    """``statement`` with every asyncq object named with ``schema``, but the name of an
    index it creates (which CREATE INDEX refuses with a schema)."""
    created = {match.start(1) for match in _CREATED_INDEX.finditer(statement)}
    return _OBJECTS.sub(
        lambda match: (
            match[0] if match.start(1) in created else sql.Identifier(schema, match[1]).as_string()
        ),
        statement,
    )


def migrations() -> list[Migration]:
    folder = resources.files("asyncq").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


LATEST_VERSION = migrations()[-1].version


async def apply(
    conn: Conn, schema: str | None = None, *, lock: Conn, ready_by_task: bool = False
) -> list[int]:
    """Bring the schema up to date; returns the versions applied now. Idempotent.

    With ``schema``, everything is created in that schema (created if missing);
    else in the connection's current schema. ``conn`` is the migration's own; ``lock``,
    another, holds the migration lock in a transaction (its server connection is held
    meanwhile, also through PgBouncer); both are left in autocommit. With
    ``ready_by_task``, the index the claim of limited tasks reads is made too.
    """
    await conn.set_autocommit(True)
    async with _locked(lock, schema) as held:
        if schema is not None:
            # Even with IF NOT EXISTS, CREATE SCHEMA needs CREATE on the database: skip it
            # for a schema that exists, so a role that owns only its schema can migrate.
            found = await (await conn.execute(_SCHEMA_EXISTS, (schema,))).fetchone()
            if not (found and found[0]):
                await conn.execute(sql.SQL(_CREATE_SCHEMA).format(sql.Identifier(schema)))
        async with _in_schema(conn, schema):
            await conn.execute(_VERSION_TABLE)
            applied = {row[0] for row in await (await conn.execute(_APPLIED)).fetchall()}
        done = []
        for migration in migrations():
            if migration.version in applied:
                continue
            held.check()
            if migration.transactional:
                async with _in_schema(conn, schema):
                    await conn.execute(migration.sql)
                    await conn.execute(_RECORD, (migration.version, migration.name))
            else:
                await _apply_outside_a_transaction(conn, migration, schema)
            logger.info(
                "applied migration %04d_%s",
                migration.version,
                migration.name,
                extra={"action": "migration_applied", "version": migration.version},
            )
            done.append(migration.version)
        if ready_by_task:
            held.check()
            await _add_index(conn, _READY_BY_TASK, schema)
        return done


class _Held:
    """The migration lock, held by a transaction on ``conn``; kept alive by a statement
    every `KEEP_ALIVE_EVERY` seconds, which also finds out when it is lost."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.lost: BaseException | None = None
        self.done = asyncio.Event()

    async def keep(self) -> None:
        while True:
            with anyio.move_on_after(KEEP_ALIVE_EVERY):
                await self.done.wait()
                return
            try:
                await self.conn.execute(_KEEP_ALIVE, prepare=False)
            except psycopg.Error as exc:
                self.lost = exc
                return

    def check(self) -> None:
        """Raise if the lock was lost (its connection with it)."""
        if self.lost is not None:
            reason = " ".join(str(self.lost).split()) or type(self.lost).__name__
            raise psycopg.OperationalError(f"the migration lock was lost: {reason}")


@contextlib.asynccontextmanager
async def _locked(lock: Conn, schema: str | None) -> AsyncIterator[_Held]:
    """Hold the migration lock of ``schema`` (None: the current schema) in a transaction
    on ``lock``, taken by polling; released by the transaction's rollback."""
    await lock.set_autocommit(False)
    await lock.set_isolation_level(IsolationLevel.READ_COMMITTED)  # no snapshot held
    try:
        while True:
            row = await (await lock.execute(_TRY_LOCK, (schema,), prepare=False)).fetchone()
            if row and row[0]:
                break
            await lock.rollback()  # between tries, no transaction holds a server connection
            await asyncio.sleep(_LOCK_POLL)
        await lock.execute(_NO_IDLE_TIMEOUT, prepare=False)
        held = _Held(lock)
        keeper = asyncio.get_running_loop().create_task(held.keep())
        try:
            yield held
        finally:
            held.done.set()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([keeper])
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error):
            await lock.rollback()
            await lock.set_autocommit(True)


@contextlib.asynccontextmanager
async def _in_schema(conn: Conn, schema: str | None) -> AsyncIterator[None]:
    """A transaction on ``conn`` whose search_path is ``schema`` (None: left as it is)."""
    async with conn.transaction():
        if schema is not None:
            await conn.execute(sql.SQL(_USE_SCHEMA).format(sql.Identifier(schema)))
        yield


async def _drop_invalid_indexes(conn: Conn, schema: str | None) -> None:
    """Drop what a CREATE INDEX CONCURRENTLY that was interrupted left behind."""
    async with _in_schema(conn, schema):
        invalid = await (await conn.execute(_INVALID_INDEXES)).fetchall()
    for (index,) in invalid:  # named with its schema
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}")


async def _add_index(conn: Conn, statement: str, schema: str | None) -> None:
    await _drop_invalid_indexes(conn, schema)
    await conn.execute(statement if schema is None else _qualified(statement, schema))


async def _apply_outside_a_transaction(
    conn: Conn, migration: Migration, schema: str | None
) -> None:
    await _drop_invalid_indexes(conn, schema)
    for statement in migration.statements(schema):
        await conn.execute(statement)
    async with _in_schema(conn, schema):
        await conn.execute(_RECORD, (migration.version, migration.name))


async def check(conn: AsyncConnection[Any], schema: str) -> None:
    """Raise `SchemaNotMigrated` unless ``schema`` is at this asyncq's version."""
    row = await (await conn.execute(_HAS_VERSIONS, (schema,))).fetchone()
    version = 0
    if row and row[0]:
        table = sql.Identifier(schema, "asyncq_migrations")
        cur = await conn.execute(sql.SQL(_CURRENT).format(table))
        found = await cur.fetchone()
        version = int(found[0]) if found else 0
    if version < LATEST_VERSION:
        raise SchemaNotMigrated(
            f"the asyncq schema is at version {version}, this asyncq needs {LATEST_VERSION}:"
            " run `asyncq migrate MODULE:APP` (or `await app.migrate()`)"
        )
