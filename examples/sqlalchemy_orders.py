"""SQLAlchemy and asyncq: an ORM object and its job, in one session's transaction.

From the repository root (SQLAlchemy comes with the ``test`` extra, or
``pip install 'asyncq[sqlalchemy]'``)::

    python examples/sqlalchemy_orders.py

It adds an ``Order`` in an ``AsyncSession`` and defers its job on that session
(``options(conn=session)``): both commit. Then the same with an exception before the
commit: neither is written. Then a synchronous ``Session`` with ``defer_sync``, as a
Flask view or a script would (here in a thread). A worker runs the jobs, and the
orders are read back.

The engines use SQLAlchemy's psycopg dialect (``postgresql+psycopg://``) and connect
wherever asyncq does: ``$ASYNCQ_DSN``, else the embedded PostgreSQL. The example's
table is ``example_orders``, dropped and made again on each run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from sqlalchemy import String, create_engine, select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

import asyncq

QUEUE = "sqlalchemy-example"  # the worker below serves only this queue

app = asyncq.App()


async def _connect() -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(app.dsn)


# Your own engines would name the database: create_async_engine("postgresql+psycopg://...").
engine = create_async_engine("postgresql+psycopg://", async_creator=_connect)
Session = async_sessionmaker(engine, expire_on_commit=False)
sync_engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(app.dsn))
SyncSession = sessionmaker(sync_engine, expire_on_commit=False)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "example_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), default="new")
    job_id: Mapped[int | None]


@app.task(queue=QUEUE, name="sqlalchemy_example.send_confirmation")
async def send_confirmation(order_id: int) -> None:
    async with Session() as session, session.begin():
        order = await session.get(Order, order_id)
        if order is not None:
            order.status = "confirmed"


async def place_order(item: str, *, fail: bool = False) -> Order:
    async with Session() as session, session.begin():
        order = Order(item=item)
        session.add(order)
        await session.flush()  # the INSERT runs now, and order.id is known
        order.job_id = await send_confirmation.options(conn=session).defer(order_id=order.id)
        if fail:
            raise RuntimeError("payment declined (on purpose)")
    # Committed here, when the block ends: the order and its job together.
    return order


def place_order_sync(item: str) -> Order:
    """The same from synchronous code: a Session, and defer_sync."""
    with SyncSession.begin() as session:
        order = Order(item=item)
        session.add(order)
        session.flush()
        order.job_id = send_confirmation.options(conn=session).defer_sync(order_id=order.id)
    return order


async def counts() -> tuple[int, int]:
    """Orders, and jobs of this example's queue."""
    async with app.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM example_orders),"
            " (SELECT count(*) FROM asyncq_jobs WHERE queue = %s)",
            (QUEUE,),
        )
        row = await cursor.fetchone()
    assert row is not None
    return row[0], row[1]


async def main() -> None:
    async with app:
        await app.migrate()
        async with app.pool.connection() as conn:
            await conn.execute("DELETE FROM asyncq_jobs WHERE queue = %s", (QUEUE,))
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.drop_all)
            await conn.run_sync(Base.metadata.create_all)

        order = await place_order("book")
        print(f"committed:    order {order.id} ({order.item}) and its job {order.job_id}")
        try:
            await place_order("lamp", fail=True)
        except RuntimeError as exc:
            orders, jobs = await counts()
            print(f"rolled back:  {exc}; orders: {orders}, jobs: {jobs}")

        order = await asyncio.to_thread(place_order_sync, "pen")
        print(f"sync Session: order {order.id} ({order.item}) and its job {order.job_id}")

        stats = await app.run_worker(queues=[QUEUE], drain=True, handle_signals=False)
        print(f"worker:       {stats.done} jobs done")
        async with Session() as session:
            for order in await session.scalars(select(Order).order_by(Order.id)):
                print(f"  order {order.id} {order.item:5} {order.status}, job {order.job_id}")
    await engine.dispose()
    sync_engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
