"""Group writes of jobs deferred on the App's pool.

A defer that finds no write in flight writes its job at once, so a lone defer waits
for nothing. Defers that arrive while a write is in flight gather; a task of the
inserter's own waits for that write to end and then writes all of them with one
INSERT: one round trip and one commit for many jobs when a busy web app defers from
many coroutines. The writes go over a connection kept out of the pool between them.

The gathered write runs in no caller's task, so a caller that gives up (cancelled by
asyncio or anyio, by a timeout or a server) leaves the others' write alone. If the
database refuses the gathered INSERT for good, each job is written alone, so that only
the caller whose job it refuses gets the error.
"""

from __future__ import annotations

import asyncio

from psycopg_pool import AsyncConnectionPool

from asyncq.pools import KeptConnection
from asyncq.store import NewJob, Store
from asyncq.transient import is_transient


class Inserter:
    def __init__(self, *, pool: AsyncConnectionPool, store: Store) -> None:
        self.kept = KeptConnection(pool)
        self.store = store
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._gathering: list[tuple[NewJob, asyncio.Future[int]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def insert(self, job: NewJob) -> int:
        """Write one job; returns its id. A cancelled call may still have written its job."""
        if not self._in_flight:
            # Written here rather than by `_write_gathered`: a lone defer is the common case.
            self._write_starts()
            try:
                async with self.kept.connection() as conn:
                    return await self.store.insert_job(conn, job)
            finally:
                self._write_ends()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._gathering.append((job, future))
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_gathered())
        return await future

    async def _write_gathered(self) -> None:
        batch: list[tuple[NewJob, asyncio.Future[int]]] = []
        try:
            await self._idle.wait()
            batch, self._gathering = self._gathering, []
            self._writer = None  # defers from now on gather for the next write
            batch = [(job, waiting) for job, waiting in batch if not waiting.done()]
            if batch:
                self._write_starts()
                try:
                    await self._write(batch)
                finally:
                    self._write_ends()
        except BaseException as exc:  # every gathered caller hears of it, then it goes on
            for _, waiting in batch or self._gathering:
                if waiting.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    waiting.cancel()
                else:
                    waiting.set_exception(exc)
            raise
        finally:
            if self._writer is asyncio.current_task():
                self._writer = None

    async def _write(self, batch: list[tuple[NewJob, asyncio.Future[int]]]) -> None:
        try:
            async with self.kept.connection() as conn:
                if len(batch) == 1:
                    ids = [await self.store.insert_job(conn, batch[0][0])]
                else:
                    ids = await self.store.insert_rows(conn, rows=[job for job, _ in batch])
        except Exception as exc:  # noqa: BLE001 - handed to the callers
            if len(batch) == 1 or is_transient(exc):
                for _, waiting in batch:
                    if not waiting.done():
                        waiting.set_exception(exc)
                return
            await self._write_each(batch)  # refused for good: find whose job it refuses
            return
        for (_, waiting), job_id in zip(batch, ids, strict=True):
            if not waiting.done():  # done: its caller was cancelled
                waiting.set_result(job_id)

    async def _write_each(self, batch: list[tuple[NewJob, asyncio.Future[int]]]) -> None:
        for job, waiting in batch:
            try:
                async with self.kept.connection() as conn:
                    job_id = await self.store.insert_job(conn, job)
            except Exception as exc:  # noqa: BLE001 - handed to its caller
                if not waiting.done():
                    waiting.set_exception(exc)
            else:
                if not waiting.done():
                    waiting.set_result(job_id)

    def _write_starts(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _write_ends(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()

    async def close(self) -> None:
        """Let a gathered write finish, then hand the kept connection back to the pool."""
        if self._writer is not None:
            await asyncio.wait([self._writer])
        await self.kept.release()
