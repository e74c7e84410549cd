"""asyncq quick start: queue 203 jobs and run a worker on them, in one process.

From the repository root::

    python examples/quickstart.py

The database is ``$ASYNCQ_DSN`` when it is set; otherwise asyncq starts its
embedded PostgreSQL (``pip install 'asyncq[embedded]'``) in
``~/.local/share/asyncq/pgdata``, leaves it running for the next run, and uses this
project's database on it, ``asyncq_<the repository's directory>`` (made on first
use): the one ``asyncq worker examples.quickstart:app`` finds too.

What it does: registers two tasks, creates the schema, defers 200 jobs with
one ``defer_many`` plus three with ``defer``, runs a worker in the background
while printing progress, stops it once every job has finished, and prints a
summary read back from the ``asyncq_jobs`` table. One job fails on its first
attempt on purpose and succeeds on the retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
import time

import asyncq
from asyncq import embedded

QUEUE = "quickstart"  # the worker below serves only this queue, not other apps' jobs
TIMEOUT = 60.0  # give up (and exit 1) if the jobs have not finished by then

app = asyncq.App()


@app.task(queue=QUEUE, name="quickstart.send_email")
async def send_email(order_id: int) -> None:
    """Pretend to send an order confirmation."""
    await asyncio.sleep(random.uniform(0.02, 0.12))


@app.task(
    queue=QUEUE,
    name="quickstart.charge_card",
    max_attempts=3,
    retry=asyncq.Backoff(base=0.2, cap=0.5),  # retry after 0.2 s (plus jitter), not 1 s
)
async def charge_card(order_id: int, amount_cents: int) -> None:
    """Fails on its first attempt, like a payment gateway timing out, then succeeds."""
    job = asyncq.current_job()
    if job.attempt == 1:
        raise TimeoutError(f"payment gateway timed out for order {order_id} (on purpose)")
    await asyncio.sleep(0.01)


async def count_by_status(ids: list[int]) -> dict[str, int]:
    async with app.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT status, count(*) FROM asyncq_jobs WHERE id = ANY(%s) GROUP BY status",
            (ids,),
        )
        return {status: count for status, count in await cursor.fetchall()}


async def main() -> int:
    started = time.monotonic()
    async with app:  # resolves the DSN (or starts the embedded server) and opens the pool
        await app.migrate()

        ids = await send_email.defer_many([{"order_id": n} for n in range(1, 201)])
        ids.append(await send_email.defer(order_id=201))
        ids.append(await send_email.options(priority=10).defer(order_id=202))
        retried_id = await charge_card.defer(order_id=202, amount_cents=4999)
        ids.append(retried_id)
        total = len(ids)
        print(f"deferred {total} jobs on queue {QUEUE!r}", flush=True)

        # A drain worker (run_worker(drain=True)) returns as soon as nothing is *ready*,
        # which would be while charge_card waits for its retry. So run an ordinary
        # worker in the background and stop it once every job is done or failed.
        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=20, poll_interval=0.2)
        )
        shown = -1
        counts: dict[str, int] = {}
        while True:
            counts = await count_by_status(ids)
            finished = counts.get("done", 0) + counts.get("failed", 0)
            if finished != shown:
                print(f"jobs done: {finished}/{total}", flush=True)
                shown = finished
            if finished == total or worker.done() or time.monotonic() - started > TIMEOUT:
                break
            await asyncio.sleep(0.25)
        worker.cancel()  # a cancelled worker hands back any job it was still running
        with contextlib.suppress(asyncio.CancelledError):
            await worker

        async with app.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT status, attempts, max_attempts, last_error FROM asyncq_jobs WHERE id = %s",
                (retried_id,),
            )
            row = await cursor.fetchone()
            cursor = await conn.execute(
                "SELECT current_setting('server_version'), current_database()"
            )
            version_row = await cursor.fetchone()
    elapsed = time.monotonic() - started

    version, name = version_row if version_row else ("?", "?")
    if os.environ.get("ASYNCQ_DSN"):
        database = f"{name} on the PostgreSQL server named by ASYNCQ_DSN"
    else:
        database = f"{name} on the embedded PostgreSQL in {embedded.data_directory()}"
    print()
    print("summary")
    print(f"  database:     {database} (PostgreSQL {version})")
    print(f"  jobs:         {total}, " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if row is not None:
        status, attempts, max_attempts, last_error = row
        first_line = (last_error or "").splitlines()[0] if last_error else "-"
        print(
            f"  retried job:  #{retried_id} charge_card is {status} after"
            f" {attempts} of {max_attempts} attempts (first error: {first_line})"
        )
    print(f"  elapsed:      {elapsed:.1f}s")
    done = counts.get("done", 0)
    if done == total:
        print(f"all {total} jobs done")
        return 0
    print(f"not all jobs done: {counts}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    logging.basicConfig(
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stdout
    )
    logging.getLogger("asyncq").setLevel(logging.INFO)  # shows which database is used
    sys.exit(asyncio.run(main()))
