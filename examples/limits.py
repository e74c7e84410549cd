"""Limits: at most N jobs of a task at once, per group, or per second, across workers.

From the repository root::

    python examples/limits.py

A worker with 20 slots runs three limited tasks in this process while the example
watches the jobs table; once every job is done it prints the most jobs it saw running
at once (per task, and per customer) and the most that started in any one second. The
database is ``$ASYNCQ_DSN`` when it is set, else the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections import Counter
from datetime import timedelta

import asyncq

QUEUE = "limits"
app = asyncq.App()


@app.task(queue=QUEUE, name="limits.render_report", concurrency=2)
async def render_report(month: str) -> None:
    """Heavy on memory: two at a time, however many workers run."""
    await asyncio.sleep(0.1)


@app.task(queue=QUEUE, name="limits.sync_customer", group_concurrency=1)
async def sync_customer(customer: str, page: int) -> None:
    """One sync per customer at a time (their API allows one session), pages in order."""
    await asyncio.sleep(0.05)


@app.task(queue=QUEUE, name="limits.send_sms", rate_limit="5/s")
async def send_sms(to: str) -> None:
    """The SMS gateway takes 5 messages a second."""


async def running(conn: object) -> tuple[Counter[str], Counter[str]]:
    cur = await conn.execute(  # type: ignore[attr-defined]
        "SELECT task_name, group_key, count(*) FROM asyncq_jobs"
        " WHERE status = 'running' AND queue = %s GROUP BY 1, 2",
        (QUEUE,),
    )
    tasks: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    for task, group, n in await cur.fetchall():
        tasks[task] += n
        if group:
            groups[group] = n
    return tasks, groups


async def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    async with app:
        await app.migrate()
        async with app.pool.connection() as conn:
            await conn.execute("DELETE FROM asyncq_jobs WHERE queue = %s", (QUEUE,))
        await render_report.defer_many([{"month": f"2026-{m:02}"} for m in range(1, 9)])
        for customer in ("acme", "globex", "initech"):
            await sync_customer.options(group=customer).defer_many(
                [{"customer": customer, "page": page} for page in range(1, 5)]
            )
        ids = await send_sms.defer_many([{"to": f"+4670000{n:04}"} for n in range(12)])

        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=20, handle_signals=False)
        )
        most: Counter[str] = Counter()
        most_per_customer = 0
        async with app.pool.connection() as conn:
            while True:
                tasks, groups = await running(conn)
                most |= tasks
                most_per_customer = max([most_per_customer, *groups.values()])
                cur = await conn.execute(
                    "SELECT count(*) FILTER (WHERE status <> 'done') FROM asyncq_jobs"
                    " WHERE queue = %s",
                    (QUEUE,),
                )
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    break
                await asyncio.sleep(0.005)
            cur = await conn.execute(
                "SELECT locked_at FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY locked_at", (ids,)
            )
            starts = [at for (at,) in await cur.fetchall()]
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    second = timedelta(seconds=1)
    per_second = max(sum(1 for t in starts if s <= t < s + second) for s in starts)
    print(f"render_report: at most {most['limits.render_report']} running at once (limit 2)")
    print(f"sync_customer: at most {most_per_customer} running per customer (limit 1)")
    print(f"send_sms:      at most {per_second} started in any second (limit 5/s)")
    within = most["limits.render_report"] <= 2 and most_per_customer <= 1 and per_second <= 5
    print("every limit held" if within else "A LIMIT WAS EXCEEDED")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
