"""How asyncq uses its connections: the TCP options of every connection, a deadline on
every database call, reconnecting, and keeping a connection.

**Dead peers.** A connection whose peer vanished without a word (a dropped NAT entry, a
hung pooler or VM, a cut link) is noticed by the kernel's own limits only after about
15 minutes for a statement waiting for its answer and two hours for an idle one. Every
connection asyncq opens asks for TCP keepalives and a TCP user timeout (`TCP_DEFAULTS`,
less what its DSN sets itself), so that the kernel gives such a connection up within
about 6 s, idle or busy, and the next read fails as after any lost connection.

**Deadlines.** A peer that still answers TCP but never the query (a pooler that lost its
server, a statement stuck behind a lock) is not dead to the kernel: every database call
asyncq makes has a deadline (`DEADLINE` unless the caller says otherwise), counted from
when it asks the pool for a connection. A call still in flight then is abandoned by
cutting its connection (`Deadlines`): the socket is shut down, libpq fails the call as it
fails after a TCP timeout, psycopg marks the connection broken, and the pool replaces it:
it never goes back to the pool in an unknown state. The caller gets `TimeoutError` and,
in the worker's services, tries again on another connection. The statement itself may
have run: the server may have committed it and lost only the answer. Every write of the
worker is safe to repeat (the fence on ``claims``), and a claim that committed leaves its
jobs to their lease.

**Reconnecting.** psycopg_pool retries a connection that failed after 1, 2, 4, 8...
seconds, for up to its ``reconnect_timeout`` (five minutes by default), and while a slot
waits for its next try the pool opens nothing else in it. A server back after 17 s then
waits for the try at about 31 s: a worker sat idle that long, and its heartbeat, on a
pool of two, could miss a whole lease and lose the job it was running to the reaper.
asyncq's pools give a series of tries up after a few seconds and start a new one at
once, so that a connection is tried at least every two seconds for as long as the
server is away.

**Read-only servers.** After a failover a connection may stay open to a server that
takes no writes: an old primary fenced with ``default_transaction_read_only``, or a
standby behind an address (a proxy, a virtual IP) that moved. Its writes fail with
``ReadOnlySqlTransaction`` and its reads may be stale, but psycopg_pool keeps a connection
that raised anything but a connection error. So a call whose server is read-only, by
the error or as the server reports it (``in_hot_standby``, ``default_transaction_read_only``:
PostgreSQL 14 and later report both), closes its connection, and the pool replaces it:
a new connection goes where the DSN now leads (``target_session_attrs=read-write`` passes
read-only servers over). Unless the DSN asks for a read-only server itself
(``target_session_attrs`` ``read-only``, ``standby`` or ``prefer-standby``).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import anyio
import psycopg
from psycopg import AsyncConnection, errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ConnStatus
from psycopg_pool import AsyncConnectionPool

logger = logging.getLogger(__name__)

RECONNECT_TIMEOUT = 4.0  # a series tries at about 0, 1, 3 and 4 s
KEEP_IDLE = 0.1
KEEP_FOR = 60.0

# A connection is given up by the kernel after 6 s without an answer: an idle one sends
# its first keepalive probe after 3 s of silence and one a second after that; one waiting
# for an answer (or a probe's) gives up after 6 s without an acknowledgement. A peer that
# is only slow answers the probes from its kernel, however long its statement runs.
TCP_DEFAULTS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 3,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 6000,  # milliseconds
}
# Seconds a database call may take, from asking for a connection to its answer.
DEADLINE = 10.0

# Whether the server is still at work on the statement ``conn`` waits for (asked on
# another connection): see `KeptConnection`.
Look = Callable[[AsyncConnection[Any]], Awaitable[bool]]


def tcp_defaults(dsn: str) -> dict[str, int]:
    """`TCP_DEFAULTS` less the options ``dsn`` sets itself: the DSN's own values win."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        given = {}
    defaults = {k: v for k, v in TCP_DEFAULTS.items() if k not in given}
    if psycopg.pq.version() < 120000:  # libpq before 12 refuses tcp_user_timeout
        defaults.pop("tcp_user_timeout", None)
    return defaults


def for_dsn(kwargs: Mapping[str, Any], dsn: str) -> dict[str, Any]:
    """``kwargs`` (made for the App's DSN) with the TCP options `tcp_defaults` gives for
    ``dsn``: a LISTEN connection may go to another DSN (``App(listen_dsn=...)``), whose
    own options win there."""
    return {**{k: v for k, v in kwargs.items() if k not in TCP_DEFAULTS}, **tcp_defaults(dsn)}


async def reconnect_now(pool: AsyncConnectionPool) -> None:
    """The pools' ``reconnect_failed``: a series of tries gave up; start the next."""
    if not pool.closed:
        await pool.check()  # lets the pool grow again, which tries a connection now


def reconnect_options() -> dict[str, Any]:
    """Keyword arguments for an `AsyncConnectionPool` that keeps trying every few seconds."""
    return {"reconnect_timeout": RECONNECT_TIMEOUT, "reconnect_failed": reconnect_now}


# -- read-only servers -----------------------------------------------------------------------

# What a server that takes no writes reports as "on" (PostgreSQL 14 and later).
_READ_ONLY_REPORTS = (b"in_hot_standby", b"default_transaction_read_only")
_READ_ONLY_WANTED = frozenset({"read-only", "standby", "prefer-standby"})


def on_read_only_server(conn: AsyncConnection[Any], exc: BaseException | None = None) -> bool:
    """``conn``'s server takes no writes: the call failed with ``ReadOnlySqlTransaction``
    (``exc``), or the server reports itself read-only. No round trip."""
    if isinstance(exc, errors.ReadOnlySqlTransaction):
        return True
    pgconn = conn.pgconn
    if pgconn.status != ConnStatus.OK:
        return False  # lost: the pool replaces it anyway
    return any(pgconn.parameter_status(name) == b"on" for name in _READ_ONLY_REPORTS)


@functools.lru_cache(maxsize=32)
def _wants_read_only(conninfo: str) -> bool:
    try:
        attrs = conninfo_to_dict(conninfo).get("target_session_attrs")
    except psycopg.ProgrammingError:
        return False
    return attrs in _READ_ONLY_WANTED


def _to_close(
    pool: AsyncConnectionPool, conn: AsyncConnection[Any], exc: BaseException | None
) -> bool:
    """``conn``'s server takes no writes (see the module's docstring) and the pool's DSN
    does not ask for such a server: close it, for the pool to replace it. Checked after
    every call, so no coroutine unless it must close."""
    return on_read_only_server(conn, exc) and not _wants_read_only(pool.conninfo)


async def _close_read_only(conn: AsyncConnection[Any]) -> None:
    info = conn.info
    logger.info(
        "closing a connection to a read-only server (%s:%s): the next one goes where the DSN leads",
        info.host,
        info.port,
        extra={"action": "read_only_server"},
    )
    await conn.close()


# -- deadlines ------------------------------------------------------------------------------

FLOOR = 2.0  # no deadline of a `Pace` is shorter
FACTOR = 5.0  # a `Pace`'s deadline: this many times the third longest recent call
WINDOW = 100  # the calls a `Pace` remembers
LEARNED = 5  # calls a `Pace` must have seen before its deadline is theirs


class Pace:
    """How long the calls of one kind usually take, and so how long one may take before
    it is cut (`deadline`): `FACTOR` times the third longest of the last `WINDOW` calls
    that succeeded, but no less than ``floor`` and no more than ``ceiling``; until
    `LEARNED` calls have succeeded, ``first`` (the ceiling unless given). A claim that
    takes milliseconds is cut after ``floor`` seconds, not after the ten a slow call may
    need.

    A call cut at the pace's deadline doubles it for the next call, and the next, up to
    the ceiling, until one succeeds: a server that has become slower than the calls it
    answered (a disk that stalls, a lock) is not cut for ever at a pace it has lost."""

    __slots__ = ("_base", "_cuts", "_first", "_next", "_samples", "ceiling", "deadline", "floor")

    def __init__(self, ceiling: float, *, floor: float = FLOOR, first: float | None = None) -> None:
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self._first = ceiling if first is None else min(first, ceiling)
        self.deadline = self._base = self._first  # _base: before any doubling
        self._samples: list[float] = []
        self._next = 0
        self._cuts = 0

    def took(self, seconds: float) -> None:
        """A call of this kind succeeded in ``seconds``."""
        samples = self._samples
        if len(samples) < WINDOW:
            samples.append(seconds)
        else:
            samples[self._next] = seconds
        self._next = (self._next + 1) % WINDOW
        # Longer at once; shorter every few calls (the third longest costs a pass).
        if self._cuts or seconds * FACTOR > self._base or not self._next % 16:
            self._cuts = 0
            self._update()
        elif len(samples) == LEARNED:
            self._update()

    def cut(self) -> None:
        """A call of this kind was cut at this pace's deadline."""
        self._cuts = min(self._cuts + 1, 16)
        self._update()

    def _update(self) -> None:
        samples = self._samples
        if len(samples) < LEARNED:
            self._base = self._first
        else:
            self._base = max(self.floor, FACTOR * heapq.nlargest(3, samples)[-1])
        self.deadline = min(self.ceiling, self._base * 2**self._cuts)


def pace_of(deadline: float | Pace | None) -> Pace | None:
    return deadline if isinstance(deadline, Pace) else None


class _Watched:
    """A call that `Deadlines` watches: it has a connection, and learns if it was cut."""

    __slots__ = ("conn", "cut", "pool")

    conn: AsyncConnection[Any]
    cut: bool
    pool: AsyncConnectionPool

    def due(self, deadlines: Deadlines, now: float) -> None:
        """Its deadline has come: cut it."""
        deadlines.cut(self)


class Deadlines:
    """The database calls in flight in one event loop, each with its deadline (`deadlines`
    gives the running loop's). One timer, set for the earliest deadline, cuts the
    connection of every call still in flight at its deadline; a call costs a dict entry,
    not a timer of its own."""

    def __init__(self) -> None:
        self._calls: dict[_Watched, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def watch(self, call: _Watched, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time() + seconds
        self._calls[call] = at
        if at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = loop.call_at(at, self._expire), at

    def done(self, call: _Watched) -> None:
        # The timer stays: it finds nothing due and is set again for what is left.
        self._calls.pop(call, None)

    def watching(self, call: _Watched) -> bool:
        return call in self._calls

    def cut(self, call: _Watched) -> None:
        """Cut ``call``'s connection now, and tell whom its pool's `on_cut` names."""
        self._calls.pop(call, None)
        call.cut = True
        cut(call.conn)
        for told in _told_of_cuts.get(call.pool, ()):
            told()

    @property
    def watched(self) -> int:
        return len(self._calls)

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer, self._timer_at = None, float("inf")
        now = loop.time()
        for call, at in list(self._calls.items()):
            if at <= now:
                del self._calls[call]
                call.due(self, now)  # may watch it again, for later
        earliest = min(self._calls.values(), default=float("inf"))
        if earliest < self._timer_at:
            if self._timer is not None:  # set by a call watched again, for a later time
                self._timer.cancel()
            self._timer, self._timer_at = loop.call_at(earliest, self._expire), earliest


_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = (
    weakref.WeakKeyDictionary()
)
_told_of_cuts: weakref.WeakKeyDictionary[AsyncConnectionPool, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def deadlines() -> Deadlines:
    """The running event loop's `Deadlines`."""
    loop = asyncio.get_running_loop()
    found = _deadlines.get(loop)
    if found is None:
        found = _deadlines[loop] = Deadlines()
    return found


def on_cut(pool: AsyncConnectionPool, told: Callable[[], None]) -> Callable[[], None]:
    """Call ``told()`` (on the loop, at once: it must not block) whenever a call on one of
    ``pool``'s connections is cut at its deadline. Returns what stops it."""
    found = _told_of_cuts.setdefault(pool, [])
    found.append(told)

    def stop() -> None:
        if told in found:
            found.remove(told)

    return stop


def cut(conn: AsyncConnection[Any]) -> None:
    """Shut the connection's socket down, both ways: whatever waits on it wakes, and libpq
    fails it (``server closed the connection unexpectedly``) as after a lost connection.
    The file descriptor stays libpq's, to close."""
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:
        return  # closed already
    try:
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as sock:  # a duplicate
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more


async def _give_back(pool: AsyncConnectionPool, conn: AsyncConnection[Any]) -> None:
    with anyio.CancelScope(shield=True):  # a cancelled caller must not leak its connection
        await pool.putconn(conn)


def connection(pool: AsyncConnectionPool, deadline: float | Pace | None = None) -> _Call:
    """``async with connection(pool) as conn:`` one database call, from asking ``pool``
    for a connection to the end of the block, within ``deadline`` seconds: past it the
    connection is cut, and the block ends with `TimeoutError` (or `PoolTimeout`, while
    it waited for a connection). The connection goes back to the pool after it, or is
    replaced if it was cut or broke. ``deadline`` defaults to `DEADLINE`; a `Pace` gives
    its own, and learns from the call."""
    return _Call(pool, DEADLINE if deadline is None else deadline)


class _Call(_Watched):
    __slots__ = ("deadline", "pace", "since")

    def __init__(self, pool: AsyncConnectionPool, deadline: float | Pace) -> None:
        self.pool = pool
        self.pace = pace_of(deadline)
        self.deadline = deadline.deadline if isinstance(deadline, Pace) else deadline
        self.cut = False

    async def __aenter__(self) -> AsyncConnection[Any]:
        self.since = time.monotonic()
        self.conn = await self.pool.getconn(timeout=self.deadline)
        deadlines().watch(self, self.deadline - (time.monotonic() - self.since))
        return self.conn

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        deadlines().done(self)
        pace = self.pace
        if self.cut:
            await self.conn.close()
            if pace is not None:
                pace.cut()
        elif _to_close(self.pool, self.conn, exc):
            await _close_read_only(self.conn)
        elif pace is not None and exc_type is None:
            pace.took(time.monotonic() - self.since)
        await _give_back(self.pool, self.conn)
        if self.cut and isinstance(exc, Exception):
            raise _timed_out(self.deadline) from exc


def _timed_out(deadline: float) -> TimeoutError:
    return TimeoutError(
        f"a database call took longer than {deadline:g}s: its connection was closed"
    )


def _not_at_work(waited: float) -> TimeoutError:
    return TimeoutError(
        f"a database call had no answer after {waited:.1f}s and its server was not at work"
        " on it: its connection was closed"
    )


# -- a kept connection -------------------------------------------------------------------------


class KeptConnection:
    """A connection kept out of a pool between the statements of one sequential user.

    A pool hands out its connections first in, first out, so a loop that checks one out
    per statement pays for the checkout and meets a server process that has sat idle
    for a turn; on a small machine the two add a tenth to a short statement. The
    connection goes back to the pool once it has been idle for `KEEP_IDLE` seconds, so
    a quiet user never holds one that others wait for; after a failure, for the pool
    to reset or discard it; and after `KEEP_FOR` seconds, so the pool's lifetime limit
    still applies. Uses may overlap: the one that finds it taken checks out another.
    Each use is one database call with its ``deadline`` (`DEADLINE` unless given; see
    `connection`).

    With a ``look`` (and a `Pace` for ``deadline``), a use past its pace's deadline is
    not cut at once: ``look(conn)`` asks the server, on a new connection, whether it is
    still at work on that use's statement. If it is not, the use is cut then; if it is,
    the use has up to the pace's ceiling; if the look gets no answer (the way to the
    server is down for new connections too), it looks again after another deadline.
    For a call that must not be cut while the server runs it (a claim, cut after its
    commit, leaves its jobs to their lease).
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        deadline: float | Pace | None = None,
        look: Look | None = None,
    ) -> None:
        self.pool = pool
        self.pace = pace_of(deadline)
        if deadline is None:
            deadline = DEADLINE
        self.deadline = deadline.ceiling if isinstance(deadline, Pace) else deadline
        self.look = look if self.pace is not None else None
        self._conn: AsyncConnection[Any] | None = None
        self._since = 0.0
        self._used = 0.0
        self._idle_check: asyncio.TimerHandle | None = None
        self._returning: set[asyncio.Task[None]] = set()

    def connection(self) -> _Use:
        """``async with kept.connection() as conn:`` one use."""
        return _Use(self)

    async def release(self) -> None:
        """Hand the kept connection back to the pool."""
        if self._idle_check is not None:
            self._idle_check.cancel()
            self._idle_check = None
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._hand_back(conn)
        if self._returning:
            await asyncio.gather(*self._returning)

    def _keep(self, conn: AsyncConnection[Any], since: float, *, ok: bool) -> bool:
        """Keep ``conn`` after a use; False if it is to go back to the pool."""
        now = time.monotonic()
        if not (ok and self._conn is None and not self.pool.closed and now - since < KEEP_FOR):
            return False
        self._conn, self._since, self._used = conn, since, now
        if self._idle_check is None:  # one timer for many uses, not one per use
            self._idle_check = asyncio.get_running_loop().call_later(KEEP_IDLE, self._check_idle)
        return True

    def _check_idle(self) -> None:
        self._idle_check = None
        if self._conn is None:
            return  # in use: the end of the use sets the next check
        idle = time.monotonic() - self._used
        loop = asyncio.get_running_loop()
        if idle < KEEP_IDLE:
            self._idle_check = loop.call_later(KEEP_IDLE - idle, self._check_idle)
            return
        conn, self._conn = self._conn, None
        task = loop.create_task(self._hand_back(conn))
        self._returning.add(task)
        task.add_done_callback(self._returning.discard)

    async def _hand_back(self, conn: AsyncConnection[Any]) -> None:
        await _give_back(self.pool, conn)


class _Use(_Watched):
    # A class, not @asynccontextmanager: an async generator per statement costs more
    # than the statement's own Python code.
    __slots__ = ("began", "busy", "hard_at", "kept", "limit", "looking", "since", "watch")

    busy: bool  # a look found the server at work on it: left to the pace's ceiling
    hard_at: float
    limit: float | None  # the deadline it is cut at; None: cut after a look
    looking: asyncio.Task[None] | None

    def __init__(self, kept: KeptConnection) -> None:
        self.kept = kept
        self.pool = kept.pool
        self.cut = False

    async def __aenter__(self) -> AsyncConnection[Any]:
        kept = self.kept
        pace = kept.pace
        deadline = pace.deadline if pace is not None else kept.deadline
        self.began = began = time.monotonic()
        conn, kept._conn = kept._conn, None
        if conn is None:
            self.conn, self.since = await kept.pool.getconn(timeout=deadline), began
            waited = time.monotonic() - began
        else:
            self.conn, self.since, waited = conn, kept._since, 0.0
        self.watch = deadlines()
        self.limit = deadline
        if kept.look is not None:
            assert pace is not None
            self.busy, self.looking = False, None
            self.hard_at = asyncio.get_running_loop().time() + pace.ceiling - waited
        self.watch.watch(self, deadline - waited)
        return self.conn

    def due(self, deadlines: Deadlines, now: float) -> None:
        kept = self.kept
        pace = kept.pace
        if kept.look is None or now >= self.hard_at:
            if kept.look is not None:
                assert pace is not None
                self.limit = pace.ceiling
            deadlines.cut(self)
        elif self.busy:
            deadlines.watch(self, self.hard_at - now)
        else:
            assert pace is not None
            if self.looking is None:
                self.looking = _spawn(self._look(deadlines))
            deadlines.watch(self, min(self.hard_at - now, pace.deadline))

    async def _look(self, deadlines: Deadlines) -> None:
        assert self.kept.look is not None
        try:
            busy = await self.kept.look(self.conn)
        except Exception:  # noqa: BLE001 - no answer: look again at the next deadline
            return
        finally:
            self.looking = None
        if busy:
            self.busy = True
        elif deadlines.watching(self):
            self.limit = None
            deadlines.cut(self)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.watch.done(self)
        kept = self.kept
        pace = kept.pace
        if kept.look is not None and self.looking is not None:
            self.looking.cancel()
        if self.cut:
            await self.conn.close()
            await kept._hand_back(self.conn)
            if pace is not None and self.limit is not None:
                pace.cut()  # not after a look: the server was idle, not slow
            if isinstance(exc, Exception):
                if self.limit is None:
                    raise _not_at_work(time.monotonic() - self.began) from exc
                raise _timed_out(self.limit) from exc
            return
        if pace is not None and exc_type is None:
            pace.took(time.monotonic() - self.began)
        if _to_close(kept.pool, self.conn, exc):
            await _close_read_only(self.conn)
            await kept._hand_back(self.conn)
        elif not kept._keep(self.conn, self.since, ok=exc_type is None):
            await kept._hand_back(self.conn)


_looks: set[asyncio.Task[None]] = set()


def _spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    task = asyncio.get_running_loop().create_task(coro)
    _looks.add(task)  # a strong reference until it ends
    task.add_done_callback(_looks.discard)
    return task
