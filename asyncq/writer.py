"""The App's `JobWriter`: where each kind of defer writes its job.

A plain defer goes to the `Inserter` (gathered with concurrent ones, on the App's
pool); a defer with ``conn=`` writes on the caller's connection, in its transaction; a
defer with a unique key writes its own row; ``defer_many`` writes its jobs in one
statement. On the App's pool, each write is a call with a deadline (`asyncq.pools`);
on the caller's connection, the caller's own. ``defer_sync`` writes on the caller's
synchronous connection, else on a synchronous pool of the App's, opened on first use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection, Connection
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from asyncq import pools
from asyncq.errors import AppNotOpen
from asyncq.inserter import Inserter
from asyncq.store import NewJob, Store


async def _not_open(job: NewJob) -> int:
    raise AppNotOpen()


def _no_sync_pool() -> ConnectionPool:
    raise AppNotOpen()


class Writer:
    def __init__(self, store: Store, *, max_args_bytes: int) -> None:
        self.store = store
        self._max_args_bytes = max_args_bytes
        self.sync_pool: Callable[[], ConnectionPool] = _no_sync_pool
        self._pool: AsyncConnectionPool | None = None
        self._inserter: Inserter | None = None
        self._insert = _not_open

    @property
    def max_args_bytes(self) -> int:
        return self._max_args_bytes

    def open(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool
        self._inserter = Inserter(pool=pool, store=self.store)
        self._insert = self._inserter.insert

    async def close(self) -> None:
        inserter, self._inserter, self._pool = self._inserter, None, None
        self._insert = _not_open
        if inserter is not None:
            await inserter.close()

    def write(self, job: NewJob) -> Awaitable[int]:
        # Not a coroutine of its own: the hottest path is the inserter's alone.
        return self._insert(job)

    async def write_alone(
        self, job: NewJob, *, conn: AsyncConnection[Any] | None, unique_key: str | None
    ) -> int:
        if conn is not None:
            return await self.store.insert_job(conn, job, unique_key=unique_key)
        async with pools.connection(self._opened()) as pooled:
            return await self.store.insert_job(pooled, job, unique_key=unique_key)

    async def write_many(self, jobs: NewJob, *, conn: AsyncConnection[Any] | None) -> list[int]:
        if conn is not None:
            return await self.store.insert_jobs(conn, jobs)
        # One statement for every job, however many: a second more for each MB of them.
        deadline = pools.DEADLINE + len(jobs.args) / 1_000_000
        async with pools.connection(self._opened(), deadline) as pooled:
            return await self.store.insert_jobs(pooled, jobs)

    async def write_after(
        self,
        jobs: NewJob,
        *,
        after: list[int],
        failure: str,
        conn: AsyncConnection[Any] | None,
    ) -> list[int]:
        """One job per element of ``jobs.args`` (a JSON array), to run after ``after``."""
        if conn is not None:
            return await self.store.defer_after(conn, jobs=jobs, after=after, failure=failure)
        async with pools.connection(self._opened()) as pooled:
            return await self.store.defer_after(pooled, jobs=jobs, after=after, failure=failure)

    def write_sync(
        self, job: NewJob, *, conn: Connection[Any] | None, unique_key: str | None
    ) -> int:
        if conn is not None:
            return self.store.insert_job_sync(conn, job, unique_key=unique_key)
        pool = self.sync_pool()
        with pool.connection(timeout=pools.DEADLINE) as pooled:
            return self.store.insert_job_sync(pooled, job, unique_key=unique_key)

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """A connection of the App's pool, with the pool's deadline (`asyncq.pools`)."""
        return pools.connection(self._opened())

    def _opened(self) -> AsyncConnectionPool:
        if self._pool is None:
            raise AppNotOpen()
        return self._pool
