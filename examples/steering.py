"""Tasks that steer their own jobs: Retry, Snooze, Discard, retry_on and timeout.

From the repository root::

    python examples/steering.py

Five jobs, one per way a task can end besides returning, run by a worker in the same
process; it prints what each job's row says once all of them have finished. The
database is ``$ASYNCQ_DSN`` when it is set, else the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time

import asyncq

QUEUE = "steering"
TIMEOUT = 60.0

app = asyncq.App()
stock = {"sku-42": 0}


@app.task(queue=QUEUE, name="steering.fetch_rates", max_attempts=3)
async def fetch_rates(currency: str) -> dict[str, float]:
    """The rates service says "later": retry in 0.2 s (the attempt counts)."""
    if asyncq.current_job().attempt == 1:
        raise asyncq.Retry(after=0.2, reason="rate limited by the rates service")
    return {currency: 1.08}


@app.task(queue=QUEUE, name="steering.ship_when_in_stock", max_attempts=1)
async def ship_when_in_stock(sku: str) -> str:
    """Not in stock yet: look again in 0.1 s, without using up the one attempt."""
    stock[sku] += 1  # a delivery arrives while we wait
    if stock[sku] < 3:
        raise asyncq.Snooze(0.1)
    return f"shipped {sku}"


@app.task(queue=QUEUE, name="steering.import_order", max_attempts=5)
async def import_order(order_id: int) -> None:
    """Bad data will not get better: fail now, whatever attempts are left."""
    raise asyncq.Discard(f"order {order_id} refers to a deleted customer")


@app.task(queue=QUEUE, name="steering.parse_feed", retry_on=(ConnectionError,))
async def parse_feed(url: str) -> None:
    """Only network errors are retried; a bug in the feed fails the job at once."""
    raise ValueError(f"{url}: line 3 is not valid XML")


@app.task(
    queue=QUEUE,
    name="steering.build_report",
    max_attempts=2,
    timeout=0.3,
    retry=asyncq.Backoff(base=0, cap=0, jitter=0),
)
async def build_report(month: str) -> str:
    """Hangs on its first attempt; the timeout cancels that attempt, the retry is quick."""
    if asyncq.current_job().attempt == 1:
        await asyncio.sleep(3600)
    return f"report for {month}"


async def rows(ids: list[int]) -> list[tuple[object, ...]]:
    async with app.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT id, task_name, status, attempts, claims, last_error FROM asyncq_jobs"
            " WHERE id = ANY(%s) ORDER BY id",
            (ids,),
        )
        return await cursor.fetchall()


async def main() -> int:
    started = time.monotonic()
    async with app:
        await app.migrate()
        ids = [
            await fetch_rates.defer("EUR"),
            await ship_when_in_stock.defer("sku-42"),
            await import_order.defer(7),
            await parse_feed.defer("https://example.com/feed.xml"),
            await build_report.defer("2026-11"),
        ]
        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=10, handle_signals=False)
        )
        while time.monotonic() - started < TIMEOUT and not worker.done():
            found = await rows(ids)
            if all(row[2] in ("done", "failed") for row in found):
                break
            await asyncio.sleep(0.1)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        found = await rows(ids)

    print()
    print(f"{'job':>4}  {'task':<28} {'status':<7} attempts  claims  last_error")
    for job_id, task_name, status, attempts, claims, last_error in found:
        first_line = str(last_error).splitlines()[0] if last_error else "-"
        print(
            f"{job_id:>4}  {task_name!s:<28} {status!s:<7} {attempts:>8}  {claims:>6}  {first_line}"
        )
    statuses = [row[2] for row in found]
    if statuses == ["done", "done", "failed", "failed", "done"]:
        print("every job ended as its task asked")
        return 0
    print(f"unexpected statuses: {statuses}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    logging.basicConfig(
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stdout
    )
    logging.getLogger("asyncq").setLevel(logging.INFO)
    sys.exit(asyncio.run(main()))
