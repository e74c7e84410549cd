"""asyncq through PgBouncer in transaction pooling mode.

From the repository root, with PgBouncer at port 6432 and PostgreSQL at 5432::

    ASYNCQ_DSN=postgresql://app@pgbouncer.internal:6432/shop \\
    ASYNCQ_LISTEN_DSN=postgresql://app@db.internal:5432/shop \\
    python examples/pgbouncer.py

Everything goes through PgBouncer (``$ASYNCQ_DSN``) but the LISTEN connections, which
go straight to the server (``$ASYNCQ_LISTEN_DSN``): PgBouncer in transaction mode hands
each transaction to whichever server connection is free, so a LISTEN through it would
hear nothing. Without ``$ASYNCQ_LISTEN_DSN`` the App opens no LISTEN connection at all
(``listen=False``): its worker and ``app.result`` poll. No prepared statements
(``prepare_threshold=None``): a PgBouncer before 1.21, or without
``max_prepared_statements``, cannot keep them (docs/how-to/pgbouncer.md).

Migrates, defers jobs every way (one, gathered, many, in the caller's transaction),
runs a worker in this process and waits for the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

import psycopg

import asyncq

QUEUE = "pgbouncer"

listen_dsn = os.environ.get("ASYNCQ_LISTEN_DSN") or None
app = asyncq.App(
    # the DSN: $ASYNCQ_DSN, through PgBouncer
    listen_dsn=listen_dsn,
    listen=listen_dsn is not None,
    prepare_threshold=None,
)


@app.task(queue=QUEUE, name="pgbouncer.total")
async def total(order_id: int, cents: list[int]) -> dict[str, int]:
    return {"order_id": order_id, "total_cents": sum(cents)}


async def main() -> int:
    async with app:
        await app.migrate()
        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=8, poll_interval=0.2, handle_signals=False)
        )
        one = await total.defer(1, [1250, 120])
        gathered = await asyncio.gather(*(total.defer(n, [100] * n) for n in range(2, 22)))
        many = await total.defer_many([{"order_id": n, "cents": [n]} for n in range(22, 122)])
        # The caller's own connection, through PgBouncer too: its transaction keeps one
        # server connection until it ends, and the job commits with it.
        async with (
            await psycopg.AsyncConnection.connect(app.dsn, prepare_threshold=None) as conn,
            conn.transaction(),
        ):
            own = await total.options(conn=conn).defer(122, [5, 5])

        ids = [one, *gathered, *many, own]
        results = await asyncio.gather(*(app.result(i, timeout=60) for i in ids))
        print(f"{len(results)} results, the first {results[0]}, the last {results[-1]}")
        print(f"LISTEN: {'straight to the server' if app.listen else 'none, polling'}")
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main()))
