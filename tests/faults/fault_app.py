"""Tasks for the worker processes of the fault suite.

Every execution appends to a ledger file of its own process, outside the database:
``$FAULTS_LEDGER_DIR/<pid>.ledger``, one line per event,
``start|end|cancel <job_id> <attempt> <pid> <unix time>``. A line is one ``write`` to a
file opened with ``O_APPEND``: once written it survives a ``kill -9`` of the process
(no fsync: the machine does not crash in these tests, only processes and the server).

The DSN comes from ``$ASYNCQ_DSN``; ``$FAULTS_CONNECT_TIMEOUT`` sets the App's connect
timeout (and so the pool's), 10 s by default.
"""

from __future__ import annotations

import asyncio
import os
import time

import asyncq

app = asyncq.App(connect_timeout=float(os.environ.get("FAULTS_CONNECT_TIMEOUT", "10")))

_ledger: tuple[int, int] | None = None  # (pid, fd)


def record(event: str) -> None:
    global _ledger
    pid = os.getpid()
    if _ledger is None or _ledger[0] != pid:
        path = os.path.join(os.environ["FAULTS_LEDGER_DIR"], f"{pid}.ledger")
        _ledger = (pid, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    job = asyncq.current_job()
    os.write(_ledger[1], f"{event} {job.id} {job.attempt} {pid} {time.time():.6f}\n".encode())


@app.task(max_attempts=10)
async def work(ms: int = 0, tag: int = 0) -> None:
    """Sleeps ``ms`` milliseconds (none: a no-op). ``tag`` is the test's own name for it."""
    record("start")
    if ms:
        try:
            await asyncio.sleep(ms / 1000)
        except asyncio.CancelledError:
            record("cancel")
            raise
    record("end")


@app.task(max_attempts=2, retry=asyncq.Backoff(base=0.1, cap=0.2))
async def fail(tag: int = 0) -> None:
    """Always raises: retried once after a short backoff, then failed."""
    record("start")
    raise RuntimeError(f"job {tag} fails on purpose")
