"""Waiting for jobs to end: what `App.result` runs.

One `Results` per App. Its waiters share one LISTEN connection on the results channel
(outside the pool: opened on the first waiter, closed with the App), where every
statement that ends jobs sends their ids (``sql/queries.sql``). A dict maps each
waited id to its waiters' futures. Rows are looked up through the App's pool, in one
query for every id due a look:

- a new waiter's id, at once: a job that has ended already answers at once, however
  short the waiter's timeout (a waiter whose clock runs out before that look makes it
  itself);
- the ids a notification names;
- every waited id once the LISTEN connection is (re)established (what ended while it
  was not listening), and every ``poll_interval`` seconds: the safety net for a lost
  notification, or a job ended by a worker of a version that sends none.

With ``listen=False`` (``App(listen=False)``, for a PgBouncer in transaction mode
without a ``listen_dsn``) there is no LISTEN connection: the poll alone finds what ended.

Looks that fall due while one is in flight are made together by the next one. The
LISTEN connection checks its health with a round trip every ``health_interval``
seconds, and reconnects with backoff. That round trip also renews the App's row in
``asyncq_result_listeners``, written once it listens: the statements that end jobs
announce them only while such a row is fresh (a NOTIFY costs every commit that sends
one, and most fleets never wait for a result).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import anyio
import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.errors import AppNotOpen, JobCancelled, JobFailed, JobNotFound
from asyncq.store import JobEnding, Store
from asyncq.transient import backoff_delay, is_transient

logger = logging.getLogger(__name__)

ENDED = frozenset({"done", "failed", "cancelled"})
_BIGINT = range(-(2**63), 2**63)


class Results:
    def __init__(
        self,
        *,
        store: Store,
        pool: Callable[[], AsyncConnectionPool],
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        poll_interval: float = 1.0,
        health_interval: float = 10.0,
        health_timeout: float = 5.0,
        listen: bool = True,
    ) -> None:
        self.store = store
        # False (App(listen=False)): no LISTEN connection; every waited id is looked up
        # each poll_interval, and nothing announces the ends of jobs to this App.
        self.listen = listen
        self.pool = pool
        self.connect = connect
        self.poll_interval = poll_interval
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self._waiters: dict[int, list[asyncio.Future[JobEnding | None]]] = {}
        # Waiters whose job was not looked up since they started.
        self._unlooked: set[asyncio.Future[JobEnding | None]] = set()
        self._due: dict[int, str] = {}  # id -> why it is due a look
        self._look = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._looker: asyncio.Task[None] | None = None
        # Waiters answered, by why their job was looked up: "new", "notified",
        # "listening" (after a (re)connect), "poll", or "expired" (their clock ran out
        # before the first look).
        self.answered: collections.Counter[str] = collections.Counter()
        self.reconnects = 0
        self.listening = False  # the LISTEN connection is up
        # This App's row in asyncq_result_listeners, while it listens.
        self.name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._looking = False

    async def wait(self, job_id: int, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """What job ``job_id`` returned once it is done; see `App.result`."""
        if job_id not in _BIGINT:
            raise _not_found(job_id)
        future: asyncio.Future[JobEnding | None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, []).append(future)
        self._unlooked.add(future)
        self._due_a_look(job_id, "new")
        self._start()
        try:
            try:
                async with asyncio.timeout(timeout) as clock:
                    ending = await future
            except TimeoutError:
                if not clock.expired() or future not in self._unlooked:
                    raise
                # The clock ran out before the first look at the job (a timeout of 0, say):
                # that look is made all the same, so that a job that has ended answers.
                ending = await self._look_once(job_id)
        finally:
            self._forget(job_id, future)
        return _answer(job_id, ending)

    async def _look_once(self, job_id: int) -> JobEnding | None:
        """The job's ending, looked up now; `TimeoutError` if it has not ended."""
        async with pools.connection(self.pool()) as conn:
            endings = await self.store.job_endings(conn, ids=[job_id])
        ending = endings[0] if endings else None
        if ending is not None and ending.status not in ENDED:
            raise TimeoutError(f"job {job_id} has not ended")
        self.answered["expired"] += 1
        return ending

    async def close(self) -> None:
        """Stop listening and looking; every waiter left gets `AppNotOpen`."""
        tasks = [t for t in (self._listener, self._looker) if t is not None]
        self._listener = self._looker = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self.listening = False
        self._look = asyncio.Event()  # an App may open again, in another event loop
        self._fail_all(AppNotOpen("the App was closed while waiting for the job to end"))

    @property
    def waiting(self) -> int:
        """How many jobs are waited for."""
        return len(self._waiters)

    @property
    def settled(self) -> bool:
        """Listening (unless told not to listen), and no look due or in flight: whatever
        ends from now on is heard of by its notification (or by the next poll)."""
        return (self.listening or not self.listen) and not self._due and not self._looking

    # -- waiters ------------------------------------------------------------------------

    def _due_a_look(self, job_id: int, why: str) -> None:
        self._due.setdefault(job_id, why)
        self._look.set()

    def _forget(self, job_id: int, future: asyncio.Future[JobEnding | None]) -> None:
        self._unlooked.discard(future)
        futures = self._waiters.get(job_id)
        if futures is None:
            return
        if future in futures:
            futures.remove(future)
        if not futures:
            del self._waiters[job_id]
            self._due.pop(job_id, None)

    def _settle(self, due: dict[int, str], endings: list[JobEnding]) -> None:
        found = {ending.id: ending for ending in endings}
        for job_id, why in due.items():
            ending = found.get(job_id)
            if ending is not None and ending.status not in ENDED:
                continue
            for future in self._waiters.get(job_id, ()):
                if not future.done():
                    future.set_result(ending)
                    self.answered[why] += 1

    def _fail(self, ids: collections.abc.Iterable[int], error: BaseException) -> None:
        for job_id in ids:
            for future in self._waiters.get(job_id, ()):
                if not future.done():
                    future.set_exception(error)

    def _fail_all(self, error: BaseException) -> None:
        self._fail(list(self._waiters), error)

    # -- the two tasks ------------------------------------------------------------------

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._looker is None or self._looker.done():
            self._looker = loop.create_task(self._look_up())
        if self.listen and (self._listener is None or self._listener.done()):
            self._listener = loop.create_task(self._listen())

    async def _look_up(self) -> None:
        """Look up the ids due a look, in one query a turn; every waited id each poll."""
        failures = 0
        next_poll = time.monotonic() + self.poll_interval
        while True:
            if self._waiters:
                with anyio.move_on_after(max(0.0, next_poll - time.monotonic())):
                    await self._look.wait()
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.poll_interval
                    for job_id in self._waiters:
                        self._due.setdefault(job_id, "poll")
            else:
                await self._look.wait()
                next_poll = time.monotonic() + self.poll_interval
            self._look.clear()
            due, self._due = self._due, {}
            due = {job_id: why for job_id, why in due.items() if job_id in self._waiters}
            if not due:
                continue
            looking = [f for job_id in due for f in self._waiters[job_id]]
            self._looking = True
            try:
                async with pools.connection(self.pool()) as conn:
                    endings = await self.store.job_endings(conn, ids=list(due))
            except Exception as exc:  # noqa: BLE001 - handed to the waiters if not transient
                if not is_transient(exc):
                    self._fail(due, exc)
                    continue
                failures += 1
                delay = backoff_delay(failures)
                _log_failure("looking up jobs", exc, delay)
                for job_id, why in due.items():
                    self._due.setdefault(job_id, why)
                await asyncio.sleep(delay)
                continue
            finally:
                self._looking = False
            failures = 0
            self._unlooked.difference_update(looking)
            self._settle(due, endings)

    async def _listen(self) -> None:
        """Keep a LISTEN connection on the results channel; mark the ids it names due a
        look. Ends on an error that is not transient, after handing it to the waiters;
        the next waiter starts it again."""
        failures = 0
        while True:
            try:
                with anyio.fail_after(self.health_timeout):
                    conn = await self.connect()
                async with conn:
                    with anyio.fail_after(self.health_timeout):
                        channel = await self.store.results_channel(conn)
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                        # Only now are the ends of jobs announced: look up after this.
                        await self.store.results_listening(conn, listener=self.name)
                    if failures:
                        self.reconnects += 1
                        logger.info(
                            "results listener reconnected",
                            extra={"action": "results_listener_reconnected"},
                        )
                    failures = 0
                    for job_id in self._waiters:  # what ended while we were not listening
                        self._due_a_look(job_id, "listening")
                    self.listening = True
                    try:
                        await self._notified(conn)
                    finally:
                        with anyio.move_on_after(1, shield=True):
                            await self.store.results_not_listening(conn, listener=self.name)
            except Exception as exc:  # noqa: BLE001 - handed to the waiters if not transient
                self.listening = False
                if not is_transient(exc):
                    self._fail_all(exc)
                    return
                failures += 1
                delay = backoff_delay(failures)
                _log_failure("results listener connection lost", exc, delay)
                await asyncio.sleep(delay)

    async def _notified(self, conn: psycopg.AsyncConnection[Any]) -> None:
        waiters = self._waiters
        while True:
            async with aclosing(conn.notifies(timeout=self.health_interval)) as notifies:
                async for notify in notifies:  # closed on the way out: it holds a lock
                    if not waiters:
                        continue
                    for part in notify.payload.split(","):
                        try:
                            job_id = int(part)
                        except ValueError:
                            continue
                        if job_id in waiters:
                            self._due_a_look(job_id, "notified")
            with anyio.fail_after(self.health_timeout):  # a health check, and a renewal
                await self.store.results_listening(conn, listener=self.name)


def _answer(job_id: int, ending: JobEnding | None) -> Any:
    if ending is None:
        raise _not_found(job_id)
    if ending.status == "done":
        return None if ending.result is None else json.loads(ending.result)
    error = ending.last_error
    if ending.status == "cancelled":
        raise JobCancelled(f"job {job_id} was cancelled", job_id=job_id, last_error=error)
    first = (error or "").strip().splitlines()
    why = first[0] if first else "no error recorded"
    raise JobFailed(f"job {job_id} failed: {why}", job_id=job_id, last_error=error)


def _not_found(job_id: int) -> JobNotFound:
    return JobNotFound(
        f"no job has the id {job_id} (it never existed, or was pruned)", job_id=job_id
    )


def _log_failure(what: str, error: BaseException, retry_in: float) -> None:
    text = " ".join(str(error).split())
    logger.warning(
        "%s (%s%s); trying again in %.1fs",
        what,
        type(error).__name__,
        f": {text}" if text else "",
        retry_in,
        extra={"action": "results_failed"},
    )
