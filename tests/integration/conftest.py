"""Helpers for the in-process integration tests: draining workers, throwaway databases."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import psycopg
import pytest

import asyncq

Drain = Callable[..., Awaitable[asyncq.WorkerStats]]
Settle = Callable[..., Awaitable[list[tuple[Any, ...]]]]


@pytest.fixture
def drain(app: asyncq.App) -> Drain:
    """Run one in-process worker on ``app`` until no job is ready or running."""

    async def run(**options: Any) -> asyncq.WorkerStats:
        with anyio.fail_after(30):
            return await app.run_worker(drain=True, handle_signals=False, **options)

    return run


@pytest.fixture
def settle(app: asyncq.App, db: psycopg.Connection[tuple[Any, ...]], drain: Drain) -> Settle:
    """Drain until every given job is done or failed.

    Between drains it waits until the earliest ``run_at`` of the jobs still
    queued (read as database time), so retries with a short backoff are run
    as soon as they are due. Returns the final (id, status, attempts) rows.
    """

    async def run(ids: Sequence[int], *, limit: float = 20, **options: Any) -> list[Any]:
        with anyio.fail_after(limit):
            while True:
                await drain(**options)
                rows = db.execute(
                    "SELECT id, status::text, attempts,"
                    "       extract(epoch FROM run_at - clock_timestamp())::float8"
                    "  FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY id",
                    (list(ids),),
                ).fetchall()
                assert len(rows) == len(ids), "a job row disappeared"
                pending = [r[3] for r in rows if r[1] not in ("done", "failed")]
                if not pending:
                    return [r[:3] for r in rows]
                await anyio.sleep(min(max(min(pending), 0.0) + 0.005, 1.0))

    return run


@pytest.fixture
async def aconn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit async connection to the test database (usable inside tasks)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        yield conn


def count_jobs(db: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def jobs_count(db: psycopg.Connection[tuple[Any, ...]]) -> Callable[[], int]:
    return lambda: count_jobs(db)
