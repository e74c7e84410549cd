"""FastAPI, SQLAlchemy and asyncq: an ``Order`` model and its job commit together.

From the repository root (FastAPI and SQLAlchemy come with the ``test`` extra)::

    pip install -e '.[embedded,test]'
    uvicorn examples.fastapi_sqlalchemy:app                     # the web app
    asyncq worker examples.fastapi_sqlalchemy:asyncq_app        # a worker, in another shell

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"item": "book", "quantity": 2}'
    curl localhost:8000/orders/1

``POST /orders`` adds an ``Order`` in an ``AsyncSession`` and defers
``send_confirmation`` on that same session (``options(conn=session)``): the job row
is written on the session's connection, in its transaction. If anything fails after
the defer (try ``"fail": true``), the session rolls back the order and the job.

The engine uses SQLAlchemy's psycopg dialect, ``postgresql+psycopg://``, which asyncq
needs to write on the session's connection. It connects wherever asyncq does
(``$ASYNCQ_DSN``, else the embedded PostgreSQL); an application of your own would name
its database in the URL, and give asyncq the same one.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import DateTime, String, func, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import asyncq

logger = logging.getLogger(__name__)

asyncq_app = asyncq.App()


async def _connect() -> psycopg.AsyncConnection[Any]:
    # The App's database (it is open in the web app's lifespan and in a worker).
    return await psycopg.AsyncConnection.connect(asyncq_app.dsn)


engine = create_async_engine("postgresql+psycopg://", async_creator=_connect)
Session = async_sessionmaker(engine, expire_on_commit=False)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(200))
    quantity: Mapped[int]
    status: Mapped[str] = mapped_column(String(20), default="new")
    job_id: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


@asyncq_app.task(queue="emails")
async def send_confirmation(order_id: int) -> None:
    """Pretend to email the customer, then mark the order confirmed."""
    async with Session() as session, session.begin():
        order = await session.get(Order, order_id)
        if order is not None and order.status == "new":
            order.status = "confirmed"
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
    async with asyncq_app:  # opens asyncq's pool; closed when the app shuts down
        await asyncq_app.migrate()
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        try:
            yield
        finally:
            await engine.dispose()


app = FastAPI(title="asyncq + FastAPI + SQLAlchemy example", lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    async with Session() as opened:
        yield opened


SessionDep = Annotated[AsyncSession, Depends(session)]


@app.post("/orders", status_code=201)
async def create_order(body: OrderIn, session: SessionDep) -> OrderCreated:
    # One transaction: the order, its job, and the order's job_id commit together when
    # the block ends, before the response is sent.
    async with session.begin():
        order = Order(item=body.item, quantity=body.quantity)
        session.add(order)
        await session.flush()  # the INSERT runs now, and order.id is known
        job_id = await send_confirmation.options(conn=session).defer(order_id=order.id)
        order.job_id = job_id
        if body.fail:
            # Raising inside the block rolls back the order and the job.
            raise HTTPException(status_code=500, detail="failed after writing; nothing was saved")
    return OrderCreated(id=order.id, job_id=job_id)


JOB = text("SELECT id, status, attempts, last_error FROM asyncq_jobs WHERE id = :id")


@app.get("/orders/{order_id}")
async def get_order(order_id: int, session: SessionDep) -> dict[str, Any]:
    order = await session.get(Order, order_id)
    if order is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    job = (await session.execute(JOB, {"id": order.job_id})).mappings().one_or_none()
    return {
        "id": order.id,
        "item": order.item,
        "quantity": order.quantity,
        "status": order.status,
        "created_at": order.created_at,
        # A pruned job (done, past the retention period) leaves the order without one.
        "job": dict(job) if job is not None else None,
    }
