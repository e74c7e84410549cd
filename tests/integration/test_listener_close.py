"""The listener's connection is closed however its loop ends, a cancel in the middle of
a notification included.

psycopg's ``notifies()`` holds the connection's lock while it yields a notification;
left suspended by a cancel in the loop's body, it would keep holding it, and the
connection's ``__aexit__`` would wait for the lock (cancelled again: the connection
left open, for the garbage collector to find).
"""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from asyncq.worker.listener import Listener
from asyncq.worker.observer import Observer
from asyncq.worker.wakeup import DueTimes, Wakeup

pytestmark = pytest.mark.anyio


class _CancelOnWake(Wakeup):
    """A wake-up that cancels the listener's task group when a notification sets it:
    the cancel lands in the listener loop's body, at its next await."""

    def __init__(self) -> None:
        super().__init__()
        self.scope: anyio.CancelScope | None = None
        self.woken = 0

    def set(self) -> None:
        self.woken += 1
        if self.woken > 1 and self.scope is not None:  # the first is the catch-up's
            self.scope.cancel()
        super().set()


async def test_a_cancel_while_a_notification_is_handled_closes_the_connection(
    app: asyncq.App,
) -> None:
    made: list[psycopg.AsyncConnection[Any]] = []

    async def connect() -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(app.dsn, autocommit=True)
        made.append(conn)
        return conn

    async with app.pool.connection() as conn:
        channel = await app.store.channel(conn)
    wakeup = _CancelOnWake()
    listener = Listener(
        connect=connect,
        store=app.store,
        channel=channel,
        queues=None,
        wakeup=wakeup,
        due=DueTimes(wakeup),
        abort=lambda job_id, claim: None,
        waiting_due=DueTimes(Wakeup()),
        health_interval=30,
        health_timeout=10,
        observer=Observer(),
    )
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            wakeup.scope = tg.cancel_scope
            await tg.start(listener.run)
            async with app.pool.connection() as conn:
                await conn.execute("SELECT pg_notify(%s, 'default')", [channel])
            await anyio.sleep(15)  # cancelled by the notification's wake-up
    assert wakeup.woken == 2
    [conn] = made
    assert conn.closed
