"""The start states' pre-loaded drains stop their clock when the drain-mode workers exit,
so that no poll of what is left reads the queue's dead index entries while the workers
drain (benchmarks/starts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.starts import Sizes, drain
from benchmarks.systems import Point
from benchmarks.systems.sql_system import SqlSystem

pytestmark = pytest.mark.anyio


class UnpolledSql(SqlSystem):
    """Plain SQL whose probe of what is left must not run."""

    polls = 0

    async def unfinished(self) -> bool:
        self.polls += 1
        return await super().unfinished()


async def test_backlog_drain_ends_at_the_workers_exit_without_polling(
    dsn: str, tmp_path: Path
) -> None:
    system = UnpolledSql(dsn)
    await system.open()
    try:
        result = await drain(
            system,
            Point(10, 100, variant="batched"),
            Sizes(burst=100, backlog=3_000, finished=0),
            tmp_path,
            "backlog",
        )
    finally:
        await system.close()
    assert result["ok"], result
    assert result["completed"] == 3_000
    assert result["seconds"] > 0
    assert system.polls == 0


@pytest.mark.parametrize("autovacuum", [False, True])
async def test_drain_leaves_autovacuum_on_when_asked(
    dsn: str, tmp_path: Path, autovacuum: bool
) -> None:
    system = SqlSystem(dsn)
    await system.open()
    seen: list[object] = []

    async def read_options() -> None:
        row = await (
            await system.conn.execute(
                "SELECT reloptions FROM pg_class WHERE oid = 'asyncq_jobs'::regclass"
            )
        ).fetchone()
        seen.append(row[0] if row else None)

    try:
        result = await drain(
            system,
            Point(10, 100, variant="batched"),
            Sizes(burst=100, backlog=500, finished=0),
            tmp_path,
            "backlog",
            on_ready=read_options,
            autovacuum=autovacuum,
        )
    finally:
        await system.close()
    assert result["ok"], result
    (options,) = seen
    assert ("autovacuum_enabled=off" in (options or [])) is not autovacuum
