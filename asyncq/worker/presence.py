"""The worker's row in asyncq_workers (``asyncq workers``, ``app.workers()``): written as
the worker starts, refreshed every `interval` with how many jobs it runs now (one
statement, which also counts the live and dead workers for the metrics), deleted as it
stops. A role that may not write that table still runs the worker: it says so once, and
the worker goes on unlisted (docs/least-privilege.md has the grant)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta

import anyio
from anyio.abc import TaskStatus
from psycopg import errors
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.store import Store, WorkerRow
from asyncq.transient import TRANSIENT_ERRORS, is_transient
from asyncq.worker.observer import Observer
from asyncq.worker.services import every

logger = logging.getLogger("asyncq.worker")

# A worker stopping deletes its row within this long, or leaves it to the maintenance.
GOODBYE_DEADLINE = 5.0


class Presence:
    name = "presence"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        worker: str,
        version: str,
        app: str | None,
        queues: tuple[str, ...] | None,
        concurrency: int,
        interval: float,
        running: Callable[[], int],
        observer: Observer,
    ) -> None:
        self.pool = pool
        self.store = store
        self.row = WorkerRow(
            id=worker,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=version,
            app=app,
            queues=None if queues is None else list(queues),
            concurrency=concurrency,
            beat=timedelta(seconds=interval),
        )
        self.interval = interval
        self.running = running
        self.observer = observer
        self.started_at: datetime | None = None
        self.refused = False  # the role may not write the table: the worker goes unlisted

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self._start()
        task_status.started()
        try:
            if not self.refused:
                await every(self.name, lambda: self.interval, self.seen, self.observer)
            else:
                await anyio.sleep_forever()
        finally:
            if not self.refused:
                with anyio.move_on_after(GOODBYE_DEADLINE, shield=True):
                    await self._stop()

    async def _start(self) -> None:
        try:
            async with pools.connection(self.pool) as conn:
                self.started_at = await self.store.worker_started(conn, row=self.row)
        except errors.InsufficientPrivilege as exc:
            self._refuse(exc)
        except TRANSIENT_ERRORS as exc:
            if not is_transient(exc):
                raise
            # Listed at the next refresh, which writes the row if it is not there.
            self.observer.service_failed(self.name, exc, self.interval)

    async def seen(self) -> None:
        if self.refused:
            return
        try:
            async with pools.connection(self.pool) as conn:
                live, dead = await self.store.worker_seen(
                    conn, row=self.row, running=self.running(), started=self.started_at
                )
        except errors.InsufficientPrivilege as exc:
            self._refuse(exc)
            return
        self.observer.workers(live, dead)

    async def _stop(self) -> None:
        try:
            async with pools.connection(self.pool, GOODBYE_DEADLINE) as conn:
                await self.store.worker_stopped(conn, worker=self.row.id)
        except Exception as exc:  # noqa: BLE001 - the maintenance deletes the row later
            logger.info(
                "worker %s could not delete its row in asyncq_workers (%s: %s): it shows as"
                " dead until the maintenance deletes it",
                self.row.id,
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                extra={"action": "worker_row_left"},
            )

    def _refuse(self, exc: BaseException) -> None:
        self.refused = True
        logger.warning(
            "worker %s is not listed by `asyncq workers`: its role may not write"
            " asyncq_workers (%s); docs/least-privilege.md has the grant",
            self.row.id,
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            extra={"action": "worker_unlisted"},
        )
