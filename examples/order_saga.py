"""An order saga: charge, reserve, ship, and undo what was done when an order cannot go on.

From the repository root::

    python examples/order_saga.py

Each order is one job. Its task charges the card and takes the items off the shelf with
``ctx.step_tx``: each step's SQL commits in one transaction with the step's record, so
it happens exactly once, however often the job runs. Shipping is a call to a carrier
(``ctx.step``). When a step rejects the order (too little stock, an address the carrier
refuses), the steps before it are undone, each compensation a step of its own.

Three orders: the first ships, though the carrier times out on the first attempt (the
job runs again; the charge and the reservation are not repeated); the second wants more
sofas than there are (refunded); the third goes to an address the carrier refuses (the
lamp goes back on the shelf, then the refund). It prints the orders, the payments, the
stock and each job's steps. The database is ``$ASYNCQ_DSN`` when it is set, else the
embedded PostgreSQL; the example's tables (``saga_orders``, ``saga_stock``,
``saga_payments``) are dropped and made again on each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

import asyncq

QUEUE = "saga"
TIMEOUT = 60.0

app = asyncq.App()
calls: Counter[str] = Counter()  # how many times each step's function ran, in this process

Conn = psycopg.AsyncConnection[Any]
Compensation = Callable[[Conn, int], Awaitable[None]]

SCHEMA = """
DROP TABLE IF EXISTS saga_orders, saga_stock, saga_payments;
CREATE TABLE saga_orders (
    id int PRIMARY KEY,
    sku text NOT NULL,
    quantity int NOT NULL,
    amount_cents int NOT NULL,
    status text NOT NULL DEFAULT 'new',
    note text
);
CREATE TABLE saga_stock (sku text PRIMARY KEY, available int NOT NULL CHECK (available >= 0));
CREATE TABLE saga_payments (
    id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id int NOT NULL,
    kind text NOT NULL,
    amount_cents int NOT NULL
);
INSERT INTO saga_stock VALUES ('lamp', 5), ('sofa', 1);
INSERT INTO saga_orders (id, sku, quantity, amount_cents) VALUES
    (1, 'lamp', 1, 2500), (2, 'sofa', 2, 90000), (3, 'lamp', 1, 2500);
"""


# -- the steps: each returns why the order is rejected, or None ------------------------


async def charge(conn: Conn, order_id: int) -> str | None:
    """Stands for a payment (a declined card would return why); recorded in our table."""
    calls["charge"] += 1
    await conn.execute(
        "INSERT INTO saga_payments (order_id, kind, amount_cents)"
        " SELECT id, 'charge', amount_cents FROM saga_orders WHERE id = %s",
        (order_id,),
    )
    await conn.execute("UPDATE saga_orders SET status = 'charged' WHERE id = %s", (order_id,))
    return None


async def reserve(conn: Conn, order_id: int) -> str | None:
    calls["reserve"] += 1
    cursor = await conn.execute(
        "UPDATE saga_stock s SET available = available - o.quantity FROM saga_orders o"
        " WHERE o.id = %s AND s.sku = o.sku AND s.available >= o.quantity RETURNING s.sku",
        (order_id,),
    )
    if await cursor.fetchone() is None:
        cursor = await conn.execute(
            "SELECT o.quantity, o.sku, s.available FROM saga_orders o JOIN saga_stock s"
            " USING (sku) WHERE o.id = %s",
            (order_id,),
        )
        wanted, sku, available = await cursor.fetchone() or (0, "?", 0)
        return f"{wanted} {sku} ordered, {available} in stock"
    await conn.execute("UPDATE saga_orders SET status = 'reserved' WHERE id = %s", (order_id,))
    return None


async def ship(order_id: int, address: str) -> dict[str, str]:
    """The carrier's API: a tracking number, or why it will not deliver."""
    calls["ship"] += 1
    if order_id == 1 and asyncq.current_job().attempt == 1:
        raise ConnectionError("the carrier's API timed out")  # the attempt fails: retried
    if address == "Atlantis":
        return {"refused": f"the carrier does not deliver to {address}"}
    return {"tracking": f"TRK-{order_id:04d}"}


async def confirm(conn: Conn, order_id: int, tracking: str) -> None:
    await conn.execute(
        "UPDATE saga_orders SET status = 'shipped', note = %s WHERE id = %s",
        (tracking, order_id),
    )


# -- the compensations ------------------------------------------------------------------


async def refund(conn: Conn, order_id: int) -> None:
    calls["refund"] += 1
    await conn.execute(
        "INSERT INTO saga_payments (order_id, kind, amount_cents)"
        " SELECT order_id, 'refund', amount_cents FROM saga_payments"
        " WHERE order_id = %s AND kind = 'charge'",
        (order_id,),
    )


async def release(conn: Conn, order_id: int) -> None:
    calls["release"] += 1
    await conn.execute(
        "UPDATE saga_stock s SET available = available + o.quantity FROM saga_orders o"
        " WHERE o.id = %s AND s.sku = o.sku",
        (order_id,),
    )


async def cancel(conn: Conn, order_id: int, reason: str) -> None:
    await conn.execute(
        "UPDATE saga_orders SET status = 'cancelled', note = %s WHERE id = %s",
        (reason, order_id),
    )


# -- the saga ---------------------------------------------------------------------------


@app.task(
    queue=QUEUE,
    name="saga.place_order",
    max_attempts=3,
    retry=asyncq.Backoff(base=0.2, cap=0.5),
)
async def place_order(order_id: int, address: str) -> dict[str, Any]:
    """Charge, reserve and ship one order; when a step rejects it, undo the ones before.

    A rejection is a step's result, not an exception: stored with the step, it decides
    the same way in every run. An exception (the carrier timing out) fails the attempt;
    the job runs again, and the steps that finished return what they returned."""
    ctx = asyncq.current_job()
    rejected = await ctx.step_tx("charge", charge, order_id)
    if rejected:
        return await give_up(order_id, rejected, undo=[])
    rejected = await ctx.step_tx("reserve", reserve, order_id)
    if rejected:
        return await give_up(order_id, rejected, undo=[("refund", refund)])
    shipment = await ctx.step("ship", ship, order_id, address)
    if "refused" in shipment:
        return await give_up(
            order_id, shipment["refused"], undo=[("release", release), ("refund", refund)]
        )
    await ctx.step_tx("confirm", confirm, order_id, shipment["tracking"])
    return {"order": order_id, "status": "shipped", "tracking": shipment["tracking"]}


async def give_up(
    order_id: int, reason: str, undo: list[tuple[str, Compensation]]
) -> dict[str, Any]:
    """The way back: each compensation is a step, so each runs once, in this order."""
    ctx = asyncq.current_job()
    for name, compensation in undo:
        await ctx.step_tx(name, compensation, order_id)
    await ctx.step_tx("cancel", cancel, order_id, reason)
    return {"order": order_id, "status": "cancelled", "reason": reason}


# -- running it -------------------------------------------------------------------------


async def report(jobs: dict[int, int]) -> bool:
    async with app.pool.connection() as conn:
        orders = await (
            await conn.execute(
                "SELECT id, sku, quantity, status, note, (SELECT string_agg(kind || ' '"
                " || amount_cents, ', ' ORDER BY p.id) FROM saga_payments p WHERE"
                " p.order_id = o.id) FROM saga_orders o ORDER BY id"
            )
        ).fetchall()
        stock = await (
            await conn.execute("SELECT sku, available FROM saga_stock ORDER BY sku")
        ).fetchall()
        charges = await (
            await conn.execute("SELECT count(*) FROM saga_payments WHERE kind = 'charge'")
        ).fetchone()
        steps = await (
            await conn.execute(
                "SELECT j.id, j.attempts, s.name, s.attempt FROM asyncq_jobs j"
                " JOIN asyncq_steps s ON s.job_id = j.id WHERE j.id = ANY(%s)"
                " ORDER BY j.id, s.position",
                (list(jobs.values()),),
            )
        ).fetchall()
    print(f"{'order':<6}{'item':<9}{'status':<11}{'payments':<28}note")
    for order_id, sku, quantity, status, note, payments in orders:
        print(f"{order_id:<6}{f'{sku} x{quantity}':<9}{status:<11}{payments or '-':<28}{note}")
    print("stock:", ", ".join(f"{sku} {available}" for sku, available in stock))
    print()
    print("each job's steps, with the attempt that recorded them:")
    for order_id, job_id in jobs.items():
        attempts = next((row[1] for row in steps if row[0] == job_id), 0)
        recorded = " ".join(f"{name}@{attempt}" for j, _, name, attempt in steps if j == job_id)
        print(f"  order {order_id}, job {job_id}, attempts {attempts}: {recorded}")
    print()
    charged = charges[0] if charges else 0
    print(
        f"{charged} charges for {len(orders)} orders: charge() ran {calls['charge']} times,"
        f" ship() {calls['ship']} times"
    )
    statuses = [row[3] for row in orders]
    return statuses == ["shipped", "cancelled", "cancelled"] and charged == len(orders)


async def main() -> int:
    async with app:
        await app.migrate()
        async with app.pool.connection() as conn:
            await conn.execute(SCHEMA)
        addresses = {1: "1 Main Street", 2: "2 Main Street", 3: "Atlantis"}
        jobs = {n: await place_order.defer(n, address) for n, address in addresses.items()}
        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=10, handle_signals=False)
        )
        try:
            for job_id in jobs.values():
                await app.result(job_id, timeout=TIMEOUT)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        ok = await report(jobs)
    print("every order ended as its saga decided" if ok else "unexpected outcome")
    return 0 if ok else 1


if __name__ == "__main__":
    # The worker logs the failed attempt (a WARNING), here among the prints.
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    sys.exit(asyncio.run(main()))
