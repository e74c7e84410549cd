"""Group writes of jobs deferred on the App's pool.

A defer that finds no write in flight writes its job at once, so a lone defer waits
for nothing. Defers that arrive while a write is in flight gather; the first of them
waits for that write to end and then writes all of them with one INSERT: one round
trip and one commit for many jobs when a busy web app defers from many coroutines.
The writes go over a connection kept out of the pool between them.
"""

from __future__ import annotations

import asyncio

import anyio
from psycopg_pool import AsyncConnectionPool

from asyncq.pools import KeptConnection
from asyncq.store import NewJob, Store


class Inserter:
    def __init__(self, *, pool: AsyncConnectionPool, store: Store) -> None:
        self.kept = KeptConnection(pool)
        self.store = store
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._gathering: list[tuple[NewJob, asyncio.Future[int]]] = []

    async def insert(self, job: NewJob) -> int:
        """Write one job; returns its id. A cancelled call may still have written its job."""
        if not self._in_flight:
            # Written here rather than by `_write`: a lone defer is the common case.
            self._write_starts()
            try:
                async with self.kept.connection() as conn:
                    return await self.store.insert_job(conn, job)
            finally:
                self._write_ends()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._gathering.append((job, future))
        if len(self._gathering) == 1:
            # The first to gather leads the next write. Shielded: the jobs that gather
            # behind it must be written even if its own caller gives up.
            with anyio.CancelScope(shield=True):
                await self._idle.wait()
                batch, self._gathering = self._gathering, []
                try:
                    ids = await self._write([j for j, _ in batch])
                except Exception as exc:  # noqa: BLE001 - each gathered caller gets the error
                    for _, waiting in batch:
                        if not waiting.done():  # done: its caller was cancelled
                            waiting.set_exception(exc)
                else:
                    for (_, waiting), job_id in zip(batch, ids, strict=True):
                        if not waiting.done():
                            waiting.set_result(job_id)
        return await future

    async def _write(self, jobs: list[NewJob]) -> list[int]:
        self._write_starts()
        try:
            async with self.kept.connection() as conn:
                if len(jobs) == 1:
                    return [await self.store.insert_job(conn, jobs[0])]
                return await self.store.insert_rows(conn, rows=jobs)
        finally:
            self._write_ends()

    def _write_starts(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _write_ends(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()

    async def close(self) -> None:
        """Hand the kept connection back to the pool (before the pool closes)."""
        await self.kept.release()
