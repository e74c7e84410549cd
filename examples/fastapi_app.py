"""FastAPI and asyncq: the order row and its job commit together, or not at all.

From the repository root (FastAPI comes with the ``test`` extra; add uvicorn)::

    pip install -e '.[embedded,test]' uvicorn
    uvicorn examples.fastapi_app:app                    # the web app
    asyncq worker examples.fastapi_app:asyncq_app       # a worker, in another shell

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"item": "book", "quantity": 2}'
    curl localhost:8000/orders/1

``POST /orders`` inserts the order and defers ``send_confirmation`` in one
transaction on one connection: if anything fails after the insert (try
``"fail": true``), both roll back, so there is never an order without its
job, nor a job for an order that does not exist.

The database is ``$ASYNCQ_DSN``, else the embedded PostgreSQL.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from psycopg.rows import dict_row
from pydantic import BaseModel, Field

import asyncq

logger = logging.getLogger(__name__)

asyncq_app = asyncq.App()

CREATE_ORDERS = """
CREATE TABLE IF NOT EXISTS orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item text NOT NULL,
    quantity int NOT NULL,
    status text NOT NULL DEFAULT 'new',
    job_id bigint,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


@asyncq_app.task(queue="emails")
async def send_confirmation(order_id: int) -> None:
    """Pretend to email the customer, then mark the order confirmed."""
    async with asyncq_app.pool.connection() as conn:
        await conn.execute(
            "UPDATE orders SET status = 'confirmed' WHERE id = %s AND status = 'new'",
            (order_id,),
        )
    logger.info("confirmation sent for order %d", order_id)


class OrderIn(BaseModel):
    item: str = Field(min_length=1, max_length=200)
    quantity: int = Field(ge=1)
    fail: bool = False  # fail after the writes, to show that nothing is committed


class OrderCreated(BaseModel):
    id: int
    job_id: int


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with asyncq_app:  # opens the pool; closed when the app shuts down
        await asyncq_app.migrate()
        async with asyncq_app.pool.connection() as conn:
            await conn.execute(CREATE_ORDERS)
        yield


app = FastAPI(title="asyncq + FastAPI example", lifespan=lifespan)


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn) -> OrderCreated:
    # Pool connections are in autocommit mode: conn.transaction() opens one transaction
    # that covers the insert, the job and the update, and commits them together.
    async with asyncq_app.pool.connection() as conn, conn.transaction():
        cursor = await conn.execute(
            "INSERT INTO orders (item, quantity) VALUES (%s, %s) RETURNING id",
            (order.item, order.quantity),
        )
        row = await cursor.fetchone()
        assert row is not None
        order_id: int = row[0]
        job_id = await send_confirmation.options(conn=conn).defer(order_id=order_id)
        await conn.execute("UPDATE orders SET job_id = %s WHERE id = %s", (job_id, order_id))
        if order.fail:
            # Raising inside the transaction block rolls back the order and the job.
            raise HTTPException(status_code=500, detail="failed after writing; nothing was saved")
    return OrderCreated(id=order_id, job_id=job_id)


@app.get("/orders/{order_id}")
async def get_order(order_id: int) -> dict[str, Any]:
    async with asyncq_app.pool.connection() as conn:
        cursor = conn.cursor(row_factory=dict_row)
        await cursor.execute(
            """
            SELECT o.id, o.item, o.quantity, o.status, o.created_at,
                   j.id AS job_id, j.status AS job_status, j.attempts AS job_attempts,
                   j.last_error AS job_last_error
            FROM orders o LEFT JOIN asyncq_jobs j ON j.id = o.job_id
            WHERE o.id = %s
            """,
            (order_id,),
        )
        found = await cursor.fetchone()
    if found is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    job = {
        "id": found.pop("job_id"),
        "status": found.pop("job_status"),
        "attempts": found.pop("job_attempts"),
        "last_error": found.pop("job_last_error"),
    }
    # A pruned job (done, past the retention period) leaves the order without a job row.
    return {**found, "job": job if job["id"] is not None else None}
