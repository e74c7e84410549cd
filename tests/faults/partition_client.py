"""An App that defers and waits for results from inside the partitioned namespace
(``test_partition.py``): ``python -m tests.faults.partition_client``, with
``$ASYNCQ_DSN`` set, until SIGTERM.

Over and over it defers a no-op job of the harness app (``work``, in the queue
``default``) and waits for its result with ``app.result``. Beside that it keeps one
connection of its own idle, opened with the App's connection options, and watches its
socket (a poll, no round trip) to see when the kernel gives the silent peer up. Each
event is one JSON line on stdout: ``{"event": ..., "began": ..., "ended": ..., "ok":
..., "error": ...}``, times from ``time.time()``.
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import time
from typing import Any

import psycopg

from tests.harness.app import app, work

RESULT_TIMEOUT = 60.0


def say(event: str, began: float, **fields: Any) -> None:
    line = {"event": event, "began": began, "ended": time.time(), **fields}
    print(json.dumps(line), flush=True)


def alive(conn: psycopg.AsyncConnection[Any]) -> bool:
    """False once the idle connection's socket reports an error or a hang-up."""
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


async def watch_an_idle_connection() -> None:
    conn = await psycopg.AsyncConnection.connect(app.dsn, **app.connect_kwargs(role="idle"))
    began = time.time()
    say("idle_open", began)
    while alive(conn):  # noqa: ASYNC110 - a socket looked at, no event to wait for
        await asyncio.sleep(0.05)
    say("idle_dead", began)
    await conn.close()


async def defer_and_wait() -> None:
    while True:
        began = time.time()
        try:
            job_id = await work.defer(ms=0)
        except Exception as exc:  # noqa: BLE001 - reported, then tried again
            say("defer", began, ok=False, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.2)
            continue
        say("defer", began, ok=True, job=job_id)
        began = time.time()
        try:
            await app.result(job_id, timeout=RESULT_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - reported, then on to the next job
            say("result", began, ok=False, job=job_id, error=f"{type(exc).__name__}: {exc}")
        else:
            say("result", began, ok=True, job=job_id)
        await asyncio.sleep(0.2)


async def main() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with app:
        tasks = [asyncio.create_task(f()) for f in (watch_an_idle_connection, defer_and_wait)]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main())
