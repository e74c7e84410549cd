"""The listener: one dedicated LISTEN connection, outside the pools, that wakes the claim
loops.

A notification of jobs ready now wakes a claim loop at once; one of jobs that come due
later (a delayed job, a retry) sets a timer for then (`DueTimes`); one of a cancel stops
the attempt it names, if this worker runs it; one of limits changed has them read
again (`asyncq.worker.limiter`). The connection checks
its own health with a round trip on a timer (a dead socket can stay silent), reconnects
with backoff, and after every (re)connect wakes a claim loop and asks the database when
the next job comes due, for what it may have missed while it was not listening.
A server that reports itself read-only (a primary fenced after a failover) hears no
NOTIFY ever again: the health check reconnects from it too, to where the DSN now leads.

The check's round trip is given up at the pace of the checks before it (at most the
health timeout: `asyncq.pools.Pace`), and `check_now` runs it at once: when another
call of the worker was cut at its deadline, the LISTEN connection, made the same way,
may be as dead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from contextlib import aclosing
from typing import Any

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg import sql

from asyncq.pools import FLOOR, Pace, on_read_only_server
from asyncq.store import Store
from asyncq.transient import TRANSIENT_ERRORS, is_transient
from asyncq.worker.observer import Observer
from asyncq.worker.services import Tries
from asyncq.worker.wakeup import DueTimes, Wakeup

DUE = "\x1f"  # between the queue and the milliseconds in a notification of a job due later
ABORT = "\x1e"  # starts a cancel's notification: ABORT, the job's id, ':', its claim
WAKE = "\x1d"  # starts a suspension's: WAKE and the milliseconds until the job comes due
LIMITS = "\x1c"  # the limits kept in the database changed (set_limits in sql/queries.sql)


class Listener:
    name = "listener"

    def __init__(
        self,
        *,
        connect: Callable[[], Any],
        store: Store,
        channel: str,
        queues: Collection[str] | None,
        wakeup: Wakeup,
        due: DueTimes,
        abort: Callable[[int, int], None],
        waiting_due: DueTimes,
        health_interval: float,
        health_timeout: float,
        observer: Observer,
        pace: Pace | None = None,
        limits_changed: Callable[[], None] | None = None,
    ) -> None:
        self.connect = connect
        self.limits_changed = limits_changed
        self.store = store
        self.channel = channel
        self.queues = frozenset(queues) if queues else None
        self.wakeup = wakeup
        self.due = due
        self.abort = abort
        self.waiting_due = waiting_due
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.observer = observer
        self.reconnects = 0
        # The check's round trip: short before any is known, and never past the timeout.
        self.pace = pace or Pace(health_timeout, first=FLOOR)
        self._waiting: anyio.CancelScope | None = None  # for notifications, between checks
        self._check_asked = False

    def check_now(self) -> None:
        """Check the connection's health now (or as soon as it waits for notifications),
        not after the interval."""
        self._check_asked = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        tries = Tries(self.name, self.observer)
        started = False
        while True:
            try:
                with anyio.fail_after(self.health_timeout):
                    conn: psycopg.AsyncConnection[Any] = await self.connect()
                async with conn:
                    with anyio.fail_after(self.health_timeout):
                        await conn.execute(
                            sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))
                        )
                    self._check_asked = False  # a new connection: no need
                    if tries.failures:
                        self.reconnects += 1
                    self.observer.listener_connected(reconnected=bool(tries.failures))
                    tries.succeeded()
                    self.wakeup.set()  # catch up on what was deferred while we were not listening
                    if self.limits_changed is not None:  # and on limits changed meanwhile
                        self.limits_changed()
                    if not started:
                        started = True
                        task_status.started()
                    await self._catch_up(conn)
                    await self._listen(conn)
            except TRANSIENT_ERRORS as exc:
                if not is_transient(exc):
                    raise
                delay = tries.wait_after(exc)
                if not started:
                    started = True
                    task_status.started()  # the poll covers us until the listener is back
                self.wakeup.set()
                await anyio.sleep(delay)

    async def _catch_up(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Set a timer for the next job due later, and for the next waiting one: their
        notifications may have been missed."""
        with anyio.fail_after(self.health_timeout):
            queues = sorted(self.queues) if self.queues else None
            seconds = await self.store.next_due(conn, queues=queues)
            waiting = await self.store.next_wake(conn)
        if seconds is not None:
            self.due.add(seconds)
        if waiting is not None:
            self.waiting_due.add(waiting)

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        queues, wakeup, due = self.queues, self.wakeup, self.due
        while True:
            if not self._check_asked:
                with anyio.CancelScope() as self._waiting:
                    await self._hear(conn, queues, wakeup, due)
                self._waiting = None
            self._check_asked = False
            if due.overflowed and not due.pending:
                due.overflowed = False
                await self._catch_up(conn)
            await self._check(conn)

    async def _hear(
        self,
        conn: psycopg.AsyncConnection[Any],
        queues: frozenset[str] | None,
        wakeup: Wakeup,
        due: DueTimes,
    ) -> None:
        """Act on the notifications until `health_interval` passes without one."""
        # Closed on the way out: left suspended by a cancel in the loop's body, the
        # generator would hold the connection's lock, and closing it would wait.
        async with aclosing(conn.notifies(timeout=self.health_interval)) as notifies:
            async for notify in notifies:
                if notify.payload.startswith(WAKE):
                    ms = notify.payload[1:]
                    self.waiting_due.add(int(ms) / 1000 if ms.isdigit() else 0.0)
                    continue
                if notify.payload.startswith(LIMITS):
                    if self.limits_changed is not None:
                        self.limits_changed()
                    continue
                if notify.payload.startswith(ABORT):
                    job_id, _, claim = notify.payload[1:].partition(":")
                    if job_id.isdigit() and claim.isdigit():
                        self.abort(int(job_id), int(claim))
                    continue
                queue, later, ms = notify.payload.partition(DUE)
                if queues is not None and queue not in queues:
                    continue
                if later:
                    due.add(int(ms) / 1000 if ms.isdigit() else 0.0)
                else:
                    wakeup.set()
                    await asyncio.sleep(0)  # let the claim loop claim before we wait

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A round trip within its pace, and the server still takes writes."""
        pace = self.pace
        began = anyio.current_time()
        try:
            with anyio.fail_after(pace.deadline):
                await conn.execute("SELECT 1")
        except TimeoutError:
            pace.cut()
            raise
        pace.took(anyio.current_time() - began)
        if on_read_only_server(conn):
            raise psycopg.errors.ReadOnlySqlTransaction("the server has become read-only")
