"""Tasks for the worker processes that the acceptance tests start.

Every execution appends a line to the ledger file named by ``$ASYNCQ_LEDGER``,
outside the database: ``start|end|cancel <job_id> <attempt> <pid> <unix time>``.
The DSN comes from ``$ASYNCQ_DSN``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import asyncq

# The default connect timeout is 10 s; the test of an unreachable database shortens it.
app = asyncq.App(connect_timeout=float(os.environ.get("LEDGER_CONNECT_TIMEOUT", "10")))


def record(event: str) -> None:
    """Append one line to the ledger, in one write to a file opened with O_APPEND: a
    worker killed at any point leaves whole lines (the page cache outlives the process)."""
    job = asyncq.current_job()
    line = f"{event} {job.id} {job.attempt} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(os.environ["ASYNCQ_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task
async def noop(n: int = 0) -> None:
    record("start")
    record("end")


@app.task
async def sleep(seconds: float) -> None:
    record("start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record("cancel")
        raise
    record("end")


@app.task
async def kill_own_worker() -> None:
    """Kills the worker process running it, as a segfault or the OOM killer would."""
    record("start")
    os.kill(os.getpid(), signal.SIGKILL)
    await asyncio.sleep(60)
    record("end")


@app.task
async def stubborn(seconds: float = 30) -> None:
    """Swallows every cancellation, for ``seconds``."""
    record("start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            record("swallowed")
    record("end")
