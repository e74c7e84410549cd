"""Waiting for what tasks return: ``app.result``.

From the repository root::

    python examples/results.py

Defers a few jobs, runs a worker in the same process (in production it is another
process, or another host: the result travels through the database), and waits for each
job's result. The database is ``$ASYNCQ_DSN`` when it is set, else the embedded
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import asyncq

QUEUE = "results"

app = asyncq.App()


@app.task(queue=QUEUE, name="results.quote")
async def quote(items: list[str]) -> dict[str, object]:
    """A JSON-serialisable return value is stored with the done row."""
    cents = {"book": 1250, "pen": 120}
    return {"items": items, "total_cents": sum(cents[item] for item in items)}


@app.task(queue=QUEUE, name="results.charge", max_attempts=1)
async def charge(order_id: int) -> None:
    raise ValueError(f"card declined for order {order_id}")


@app.task(queue=QUEUE, name="results.tags")
async def tags() -> set[str]:
    """A set is not JSON: the job is done, its result is not stored (and the worker says
    why in a warning)."""
    return {"new", "sale"}


@app.task(queue=QUEUE, name="results.slow")
async def slow() -> str:
    await asyncio.sleep(1)
    return "slow but done"


async def main() -> int:
    async with app:
        await app.migrate()
        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=10, handle_signals=False)
        )
        quoted = await quote.defer(["book", "pen", "pen"])
        print(f"quote:  {await app.result(quoted, timeout=30)}")

        charged = await charge.defer(7)
        try:
            await app.result(charged, timeout=30)
        except asyncq.JobFailed as failed:
            print(f"charge: JobFailed: {failed}")

        tagged = await tags.defer()
        print(f"tags:   {await app.result(tagged, timeout=30)}")

        slowly = await slow.defer()
        try:
            await app.result(slowly, timeout=0.2)
        except TimeoutError:
            print("slow:   TimeoutError after 0.2s; the job runs on, and a later wait gets")
        print(f"        {await app.result(slowly, timeout=30)!r}")

        # Many waiters at once share the App's one LISTEN connection.
        ids = await quote.defer_many([{"items": ["pen"] * n} for n in range(1, 101)])
        totals = [r["total_cents"] for r in await asyncio.gather(*(app.result(i) for i in ids))]
        print(f"100 waiters at once: totals from {totals[0]} to {totals[-1]} cents")

        try:
            await app.result(10**12)
        except asyncq.JobNotFound as missing:
            print(f"10**12: JobNotFound: {missing}")

        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    return 0


if __name__ == "__main__":
    logging.basicConfig(
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stdout
    )
    logging.getLogger("asyncq").setLevel(logging.WARNING)
    sys.exit(asyncio.run(main()))
