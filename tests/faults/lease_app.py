"""Tasks for the worker processes of the listener, lease, clock and poison fault tests.

Every execution appends a line to the ledger file named by ``$ASYNCQ_LEDGER``, outside
the database, with the acceptance tests' `record`. The DSN comes from ``$ASYNCQ_DSN``;
``$LEASE_APP_POOL_MAX`` sets the App's pool_max_size (unset: the default).

``$LEASE_APP_SELF_STOP=1`` makes `freeze_then` stop its own worker process with SIGSTOP
during attempt 1: the freeze then falls at a known point of the task, so what the task
does once thawed happens before any other part of the worker runs.
"""

from __future__ import annotations

import asyncio
import os
import signal

import asyncq
from tests.acceptance.ledger_app import record

_POOL_MAX = os.environ.get("LEASE_APP_POOL_MAX")
app = asyncq.App(pool_max_size=int(_POOL_MAX) if _POOL_MAX else None)

# A task name with quotes, a semicolon, a comment and non-ASCII letters: only a name.
ODD_NAME = "odd'\"; DROP TABLE asyncq_jobs; -- naïve ✓ 名前"


async def _sleep(seconds: float) -> None:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record("cancel")
        raise


@app.task
async def noop(n: int = 0) -> None:
    record("start")
    record("end")


@app.task
async def sleep(seconds: float) -> None:
    record("start")
    await _sleep(seconds)
    record("end")


@app.task
async def sleep_by_attempt(seconds: list[float]) -> None:
    """Sleeps ``seconds[attempt - 1]``."""
    record("start")
    await _sleep(seconds[asyncq.current_job().attempt - 1])
    record("end")


@app.task(max_attempts=3)
async def freeze_then(then: str, seconds: float = 0.0) -> None:
    """With ``$LEASE_APP_SELF_STOP=1``, attempt 1 stops its worker; once continued it
    fails (``then="fail"``), returns (``"succeed"``) or goes on sleeping (``"sleep"``).
    Anywhere else: sleeps ``seconds`` and returns."""
    record("start")
    if os.environ.get("LEASE_APP_SELF_STOP") == "1" and asyncq.current_job().attempt == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        # Continued: nothing else in this process has run since the stop.
        if then == "fail":
            record("fail")
            raise RuntimeError("late failure of a worker that was frozen")
        if then == "succeed":
            record("end")
            return
    await _sleep(seconds)
    record("end")


@app.task
async def hold_connection(seconds: float) -> None:
    """Holds a connection of the worker's own pool while it sleeps."""
    record("start")
    async with app.pool.connection() as conn:
        await conn.execute("SELECT 1")
        record("got_connection")
        await _sleep(seconds)
    record("end")


@app.task
async def kill_own_worker() -> None:
    """Kills the worker process running it, as a segfault or the OOM killer would."""
    record("start")
    os.kill(os.getpid(), signal.SIGKILL)
    await asyncio.sleep(60)
    record("end")


@app.task(retry=asyncq.Backoff(base=40.0, factor=1.0, jitter=0.0))
async def fail_slowly_retried() -> None:
    """Always fails; retried exactly 40 s later."""
    record("start")
    raise RuntimeError("fails on purpose")


@app.task
async def takes(a: int, b: str) -> None:
    record("start")
    assert isinstance(a, int) and isinstance(b, str)
    record("end")


@app.task
async def raise_system_exit() -> None:
    record("start")
    raise SystemExit(3)


@app.task
async def raise_keyboard_interrupt() -> None:
    record("start")
    raise KeyboardInterrupt


@app.task(name=ODD_NAME)
async def odd_name(text: str) -> None:
    record("start")
    if text != "ünïcødé ✓ '\";":
        raise ValueError(f"argument came back as {text!r}")
    record("end")
