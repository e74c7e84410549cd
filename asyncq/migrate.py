"""Apply ``sql/migrations/NNNN_name.sql`` in order, once each, under an advisory lock.

Each migration runs in its own transaction together with its row in
``asyncq_migrations``, so a failed migration leaves nothing half done, and
concurrent ``asyncq migrate`` runs wait for each other instead of racing.

A migration whose first line is ``-- asyncq: no transaction`` runs statement by
statement outside a transaction instead, for ``CREATE INDEX CONCURRENTLY`` (an index
built while workers go on writing). Its statements are idempotent (``IF NOT EXISTS``);
an index left invalid by an interrupted build is dropped before it runs again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from psycopg import AsyncConnection, sql

from asyncq.errors import SchemaNotMigrated

logger = logging.getLogger(__name__)

# Taken by polling, not by waiting in pg_advisory_lock: a session waiting there holds a
# snapshot, which a CREATE INDEX CONCURRENTLY of the lock's holder would wait for.
_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext('asyncq.migrate.' || current_schema()))"
_LOCK_POLL = 0.05
_UNLOCK = "SELECT pg_advisory_unlock(hashtext('asyncq.migrate.' || current_schema()))"
_SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)"
_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {}"
_USE_SCHEMA = "SET search_path TO {}"
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


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def transactional(self) -> bool:
        return not self.sql.startswith(NO_TRANSACTION)

    def statements(self) -> list[str]:
        """The statements of a migration that runs outside a transaction."""
        lines = [line for line in self.sql.splitlines() if not line.lstrip().startswith("--")]
        return [part.strip() for part in "\n".join(lines).split(";") if part.strip()]


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
    conn: AsyncConnection[Any], schema: str | None = None, *, ready_by_task: bool = False
) -> list[int]:
    """Bring the schema up to date; returns the versions applied now. Idempotent.

    With ``schema``, everything is created in that schema (created if missing);
    else in the connection's current schema. ``conn`` is the migration's own. With
    ``ready_by_task``, the index the claim of limited tasks reads is made too.
    """
    await conn.set_autocommit(True)
    if schema is not None:
        # Even with IF NOT EXISTS, CREATE SCHEMA needs CREATE on the database: skip it for a
        # schema that exists, so a role that owns only its schema can migrate.
        found = await (await conn.execute(_SCHEMA_EXISTS, (schema,))).fetchone()
        if not (found and found[0]):
            await conn.execute(sql.SQL(_CREATE_SCHEMA).format(sql.Identifier(schema)))
        await conn.execute(sql.SQL(_USE_SCHEMA).format(sql.Identifier(schema)))
    while not await _try_lock(conn):  # noqa: ASYNC110 - the lock is another session's
        await asyncio.sleep(_LOCK_POLL)
    try:
        await conn.execute(_VERSION_TABLE)
        applied = {row[0] for row in await (await conn.execute(_APPLIED)).fetchall()}
        done = []
        for migration in migrations():
            if migration.version in applied:
                continue
            if migration.transactional:
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(_RECORD, (migration.version, migration.name))
            else:
                await _apply_outside_a_transaction(conn, migration)
            logger.info(
                "applied migration %04d_%s",
                migration.version,
                migration.name,
                extra={"action": "migration_applied", "version": migration.version},
            )
            done.append(migration.version)
        if ready_by_task:
            await _add_index(conn, _READY_BY_TASK)
        return done
    finally:
        await conn.execute(_UNLOCK)


async def _try_lock(conn: AsyncConnection[Any]) -> bool:
    row = await (await conn.execute(_TRY_LOCK)).fetchone()
    return bool(row and row[0])


async def _drop_invalid_indexes(conn: AsyncConnection[Any]) -> None:
    """Drop what a CREATE INDEX CONCURRENTLY that was interrupted left behind."""
    for (index,) in await (await conn.execute(_INVALID_INDEXES)).fetchall():
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}")


async def _add_index(conn: AsyncConnection[Any], statement: str) -> None:
    await _drop_invalid_indexes(conn)
    await conn.execute(statement)


async def _apply_outside_a_transaction(conn: AsyncConnection[Any], migration: Migration) -> None:
    await _drop_invalid_indexes(conn)
    for statement in migration.statements():
        await conn.execute(statement)
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
