"""Synchronous code: plain ``def`` tasks, deferred from code with no event loop.

    python examples/sync_tasks.py

A script (or a Flask view, a Django management command) defers jobs with
``defer_sync``: two on the App's own synchronous pool, and an order with its job in one
transaction of its own psycopg connection, then an order whose transaction rolls back
and takes its job with it. A worker then runs the ``def`` tasks in its thread pool;
one runs past its timeout and is told to stop through ``current_job().stop_requested``.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg

import asyncq

app = asyncq.App()


@app.task(name="sync.make_thumbnail", queue="sync_example")
def make_thumbnail(path: str, width: int = 128) -> str:
    time.sleep(0.05)  # blocking work: an image library, a sync HTTP client, an ORM
    return f"{path} at {width}px, in thread {threading.current_thread().name}"


# Set by export_report when it returns because it was told to stop.
report_stopped = threading.Event()


@app.task(name="sync.export_report", queue="sync_example", timeout=0.5, max_attempts=1)
def export_report(rows: int) -> int:
    job = asyncq.current_job()
    written = 0
    for _ in range(rows):
        if job.stop_requested:  # the timeout fired: the thread cannot be killed, so it looks
            print(f"export_report: stop requested after {written} rows, returning")
            report_stopped.set()
            return written
        time.sleep(0.01)
        written += 1
    return written


def place_order(conn: psycopg.Connection[tuple[int]], item: str, *, fail: bool) -> int:
    """A synchronous view: the order row and its job commit together, or neither does."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO sync_example_orders (item) VALUES (%s) RETURNING id", (item,)
        ).fetchone()
        assert row is not None
        order_id = row[0]
        make_thumbnail.options(conn=conn).defer_sync(f"orders/{order_id}.png", width=64)
        if fail:
            raise RuntimeError(f"payment for order {order_id} declined")
    return order_id


async def setup() -> str:
    async with app:
        await app.migrate()
        async with app.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS sync_example_orders (id serial PRIMARY KEY, item text)"
            )
        return app.dsn


async def run_worker() -> list[str]:
    async with app:
        await app.run_worker(queues=["sync_example"], drain=True, concurrency=4)
        async with app.connection() as conn:
            rows = await conn.execute(
                "SELECT id, task_name, status::text, result, last_error FROM asyncq_jobs"
                " WHERE queue = 'sync_example' ORDER BY id"
            )
            return [
                f"  #{id} {task.split('.')[-1]:<15} {status:<7}"
                f" {result if result is not None else (last_error or '')[:60]}"
                for id, task, status, result, last_error in await rows.fetchall()
            ]


def main() -> None:
    dsn = asyncio.run(setup())

    # No event loop from here on: plain synchronous code.
    first = make_thumbnail.defer_sync("cat.png")
    second = make_thumbnail.defer_sync("dog.png", width=256)
    export_report.defer_sync(rows=1000)
    print(f"deferred jobs {first} and {second} on the App's synchronous pool")
    with psycopg.connect(dsn) as conn:
        order = place_order(conn, "teapot", fail=False)
        print(f"order {order} and its thumbnail job committed together")
        try:
            place_order(conn, "kettle", fail=True)
        except RuntimeError as exc:
            print(f"rolled back with its job: {exc}")
    app.close_sync()

    lines = asyncio.run(run_worker())
    # The timed-out function runs on in its thread until it next looks at stop_requested,
    # and the worker does not wait for it (its outcome is written): wait for it here.
    report_stopped.wait(timeout=10)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
