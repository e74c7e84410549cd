"""Tasks for the acceptance tests of logs, least privilege and requeue.

Like `ledger_app`, every execution appends to the ledger file named by
``$ASYNCQ_LEDGER``. The DSN comes from ``$ASYNCQ_DSN``; the schema from
``$GUARDED_SCHEMA`` (unset: the connection's current schema). Retries come at once
(``Backoff(base=0)``) so that a ``--drain`` worker runs them before it exits.
"""

from __future__ import annotations

import asyncio
import os

import asyncq
from tests.acceptance.ledger_app import record

app = asyncq.App(schema=os.environ.get("GUARDED_SCHEMA") or None)

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)


@app.task(name="guarded.ok", retry=AT_ONCE)
async def ok(token: str = "") -> None:
    record("start")
    record("end")


@app.task(name="guarded.flaky", retry=AT_ONCE, max_attempts=3)
async def flaky(token: str) -> None:
    """Fails its first attempt, then succeeds."""
    record("start")
    if asyncq.current_job().attempt == 1:
        raise PermissionError("first attempt refused")
    record("end")


@app.task(name="guarded.doomed", retry=AT_ONCE, max_attempts=2)
async def doomed(token: str) -> None:
    """Always fails: retried once, then failed."""
    record("start")
    raise ValueError("gateway rejected the request")


@app.task(name="guarded.slow", retry=AT_ONCE, max_attempts=3)
async def slow(token: str, seconds: float) -> None:
    """Sleeps ``seconds`` on its first attempt only."""
    record("start")
    if asyncq.current_job().attempt == 1:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            record("cancel")
            raise
    record("end")


@app.task(name="guarded.until_fixed", retry=AT_ONCE, max_attempts=1)
async def until_fixed(token: str = "") -> None:
    """Fails unless the worker runs with ``GUARDED_FIXED=1``: the bug a person fixes."""
    record("start")
    if os.environ.get("GUARDED_FIXED") != "1":
        raise RuntimeError("not fixed yet")
    record("end")


# The same function under a second name, for requeueing by task name.
until_fixed_too = app.task(name="guarded.until_fixed_too", retry=AT_ONCE, max_attempts=1)(
    until_fixed.fn
)
