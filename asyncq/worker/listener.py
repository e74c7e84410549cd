"""The notifier: one dedicated LISTEN connection, outside the pool, that wakes the producer.

It checks its own health with a round trip on a timer (a dead socket can stay
silent), reconnects with backoff and jitter, and wakes the producer after every
(re)connect so that jobs deferred while it was deaf are claimed at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg import sql

from asyncq.worker.state import Wakeup, backoff_delay

logger = logging.getLogger(__name__)


class Listener:
    def __init__(
        self,
        *,
        connect: Callable[[], Any],
        channel: str,
        queues: Collection[str] | None,
        wakeup: Wakeup,
        health_interval: float,
        health_timeout: float,
    ) -> None:
        self.connect = connect
        self.channel = channel
        self.queues = frozenset(queues) if queues else None
        self.wakeup = wakeup
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.reconnects = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        failures = 0
        started = False
        while True:
            try:
                with anyio.fail_after(self.health_timeout):
                    conn: psycopg.AsyncConnection[Any] = await self.connect()
                async with conn:
                    with anyio.fail_after(self.health_timeout):
                        listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))
                        await conn.execute(listen)
                    if failures:
                        self.reconnects += 1
                        logger.info(
                            "listener reconnected", extra={"action": "listener_reconnected"}
                        )
                    failures = 0
                    self.wakeup.set()  # catch up on what was deferred while we were not listening
                    if not started:
                        started = True
                        task_status.started()
                    await self._listen(conn)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                failures += 1
                delay = backoff_delay(failures)
                logger.warning(
                    "listener connection lost (%s: %s); reconnecting in %.1fs",
                    type(exc).__name__,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                    delay,
                    extra={"action": "listener_lost"},
                )
                if not started:
                    started = True
                    task_status.started()  # the poll covers us until the listener is back
                self.wakeup.set()
                await anyio.sleep(delay)

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            async for notify in conn.notifies(timeout=self.health_interval):
                if self.queues is None or notify.payload in self.queues:
                    self.wakeup.set()
                    await asyncio.sleep(0)  # let the producer claim before we wait again
            with anyio.fail_after(self.health_timeout):
                await conn.execute("SELECT 1")
