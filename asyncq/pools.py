"""How asyncq's connection pools reconnect once the server has been away.

psycopg_pool retries a connection that failed after 1, 2, 4, 8... seconds, for up to its
``reconnect_timeout`` (five minutes by default), and while a slot waits for its next try
the pool opens nothing else in it. A server back after 17 s then waits for the try at
about 31 s: a worker sat idle that long, and its heartbeat, on a pool of two, could miss
a whole lease and lose the job it was running to the reaper. asyncq's pools give a series
of tries up after a few seconds and start a new one at once, so that a connection is
tried at least every two seconds for as long as the server is away.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

RECONNECT_TIMEOUT = 4.0  # a series tries at about 0, 1, 3 and 4 s


async def reconnect_now(pool: AsyncConnectionPool) -> None:
    """The pools' ``reconnect_failed``: a series of tries gave up; start the next."""
    if not pool.closed:
        await pool.check()  # lets the pool grow again, which tries a connection now


def reconnect_options() -> dict[str, Any]:
    """Keyword arguments for an `AsyncConnectionPool` that keeps trying every few seconds."""
    return {"reconnect_timeout": RECONNECT_TIMEOUT, "reconnect_failed": reconnect_now}
