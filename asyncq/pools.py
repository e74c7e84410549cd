"""How asyncq uses its connections: the TCP options of every connection, reconnecting,
and keeping a connection.

**Dead peers.** A connection whose peer vanished without a word (a dropped NAT entry, a
hung pooler or VM, a cut link) is noticed by the kernel's own limits only after about
15 minutes for a statement waiting for its answer and two hours for an idle one. Every
connection asyncq opens asks for TCP keepalives and a TCP user timeout (`TCP_DEFAULTS`,
less what its DSN sets itself), so that the kernel gives such a connection up within
about 6 s, idle or busy, and the next read fails as after any lost connection.

**Reconnecting.** psycopg_pool retries a connection that failed after 1, 2, 4, 8...
seconds, for up to its ``reconnect_timeout`` (five minutes by default), and while a slot
waits for its next try the pool opens nothing else in it. A server back after 17 s then
waits for the try at about 31 s: a worker sat idle that long, and its heartbeat, on a
pool of two, could miss a whole lease and lose the job it was running to the reaper.
asyncq's pools give a series of tries up after a few seconds and start a new one at
once, so that a connection is tried at least every two seconds for as long as the
server is away.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

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


async def reconnect_now(pool: AsyncConnectionPool) -> None:
    """The pools' ``reconnect_failed``: a series of tries gave up; start the next."""
    if not pool.closed:
        await pool.check()  # lets the pool grow again, which tries a connection now


def reconnect_options() -> dict[str, Any]:
    """Keyword arguments for an `AsyncConnectionPool` that keeps trying every few seconds."""
    return {"reconnect_timeout": RECONNECT_TIMEOUT, "reconnect_failed": reconnect_now}


class KeptConnection:
    """A connection kept out of a pool between the statements of one sequential user.

    A pool hands out its connections first in, first out, so a loop that checks one out
    per statement pays for the checkout and meets a server process that has sat idle
    for a turn; on a small machine the two add a tenth to a short statement. The
    connection goes back to the pool once it has been idle for `KEEP_IDLE` seconds, so
    a quiet user never holds one that others wait for; after a failure, for the pool
    to reset or discard it; and after `KEEP_FOR` seconds, so the pool's lifetime limit
    still applies. Uses may overlap: the one that finds it taken checks out another.
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
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
        with anyio.CancelScope(shield=True):  # a cancelled user must not leak its connection
            await self.pool.putconn(conn)


class _Use:
    # A class, not @asynccontextmanager: an async generator per statement costs more
    # than the statement's own Python code.
    __slots__ = ("conn", "kept", "since")

    def __init__(self, kept: KeptConnection) -> None:
        self.kept = kept

    async def __aenter__(self) -> AsyncConnection[Any]:
        kept = self.kept
        conn, kept._conn = kept._conn, None
        if conn is None:
            self.conn, self.since = await kept.pool.getconn(), time.monotonic()
        else:
            self.conn, self.since = conn, kept._since
        return self.conn

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if not self.kept._keep(self.conn, self.since, ok=exc_type is None):
            await self.kept._hand_back(self.conn)
