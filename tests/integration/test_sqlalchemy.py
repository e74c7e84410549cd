"""Defers on SQLAlchemy sessions and connections (asyncq.contrib.sqlalchemy): the job
row commits and rolls back with the ORM's writes, on the session's own connection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import asyncq
from asyncq import connections
from asyncq.testing import drain

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy comes with the test extra")

from sqlalchemy import URL, Engine, String, create_engine, text  # noqa: E402
from sqlalchemy.ext.asyncio import (  # noqa: E402
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import (  # noqa: E402
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

pytestmark = pytest.mark.anyio

Connection = psycopg.Connection[tuple[Any, ...]]


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sqla_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(200))
    job_id: Mapped[int | None]


def url(dsn: str, driver: str = "psycopg") -> URL:
    """The SQLAlchemy URL of a libpq DSN, with ``driver``."""
    params = conninfo_to_dict(dsn)
    return URL.create(
        f"postgresql+{driver}",
        username=params.get("user"),
        password=params.get("password"),
        host=params.get("host"),
        port=int(params["port"]) if params.get("port") else None,
        database=params.get("dbname"),
    )


@pytest.fixture
def orders(db: Connection) -> Iterator[None]:
    db.execute("DROP TABLE IF EXISTS sqla_orders")
    db.execute("CREATE TABLE sqla_orders (id serial PRIMARY KEY, item text, job_id bigint)")
    yield
    db.execute("DROP TABLE IF EXISTS sqla_orders")


@pytest.fixture
async def engine(dsn: str, orders: None) -> AsyncIterator[AsyncEngine]:
    made = create_async_engine(url(dsn))
    yield made
    await made.dispose()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def register(app: asyncq.App) -> asyncq.Task[[int], None]:
    @app.task(name="sqla.confirm", queue="emails")
    async def confirm(order_id: int) -> None:
        pass

    return confirm


def saved(db: Connection, jobs: str = "asyncq_jobs") -> tuple[list[Any], list[Any]]:
    """The orders (id, item, job_id) and the jobs (id, args) committed so far."""
    return (
        db.execute("SELECT id, item, job_id FROM sqla_orders ORDER BY id").fetchall(),
        db.execute(f"SELECT id, args FROM {jobs} ORDER BY id").fetchall(),  # type: ignore[arg-type]
    )


async def place(task: asyncq.Task[[int], None], session: AsyncSession, item: str) -> Order:
    """The ORM's insert, flushed for its id, and the job for it on ``session``."""
    order = Order(item=item)
    session.add(order)
    await session.flush()
    order.job_id = await task.options(conn=session).defer(order.id)
    return order


# -- AsyncSession ------------------------------------------------------------


async def test_a_committed_session_writes_the_order_and_its_job_together(
    app: asyncq.App, sessions: async_sessionmaker[AsyncSession], db: Connection
) -> None:
    confirm = register(app)
    async with sessions() as session, session.begin():
        order = await place(confirm, session, "book")
        # Not committed yet: another connection sees neither.
        assert saved(db) == ([], [])
    assert saved(db) == (
        [(order.id, "book", order.job_id)],
        [(order.job_id, {"order_id": order.id})],
    )
    xmins = db.execute(
        "SELECT (SELECT xmin::text FROM sqla_orders), (SELECT xmin::text FROM asyncq_jobs)"
    ).fetchone()
    assert xmins is not None and xmins[0] == xmins[1], "one transaction wrote both"


async def test_a_rolled_back_session_writes_neither(
    app: asyncq.App, sessions: async_sessionmaker[AsyncSession], db: Connection
) -> None:
    confirm = register(app)
    async with sessions() as session:
        await place(confirm, session, "book")
        await session.rollback()
        # The session goes on after its rollback, in a new transaction.
        await place(confirm, session, "pen")
        await session.commit()
    orders, jobs = saved(db)
    assert [o[1] for o in orders] == ["pen"]
    assert [j[1] for j in jobs] == [{"order_id": orders[0][0]}]


async def test_an_exception_inside_begin_writes_neither(
    app: asyncq.App, sessions: async_sessionmaker[AsyncSession], db: Connection
) -> None:
    confirm = register(app)
    with pytest.raises(RuntimeError, match="after the defer"):
        async with sessions() as session, session.begin():
            await place(confirm, session, "book")
            raise RuntimeError("after the defer")
    assert saved(db) == ([], [])


async def test_a_session_closed_without_commit_writes_neither(
    app: asyncq.App, sessions: async_sessionmaker[AsyncSession], db: Connection
) -> None:
    confirm = register(app)
    async with sessions() as session:
        # Defer first, on a session that has not begun: the defer begins its transaction.
        assert not session.in_transaction()
        job_id = await confirm.options(conn=session).defer(0)
        assert session.in_transaction()
        session.add(Order(item="book", job_id=job_id))
    assert saved(db) == ([], [])

    async with sessions() as session:
        job_id = await confirm.options(conn=session).defer(0)
        session.add(Order(item="book", job_id=job_id))
        await session.commit()
    orders, jobs = saved(db)
    assert [(o[1], o[2]) for o in orders] == [("book", job_id)]
    assert [j[0] for j in jobs] == [job_id]


async def test_a_rolled_back_savepoint_takes_its_job_with_it(
    app: asyncq.App, sessions: async_sessionmaker[AsyncSession], db: Connection
) -> None:
    confirm = register(app)
    async with sessions() as session, session.begin():
        kept = await place(confirm, session, "book")
        savepoint = await session.begin_nested()
        await place(confirm, session, "pen")
        await savepoint.rollback()
    orders, jobs = saved(db)
    assert [o[1] for o in orders] == ["book"]
    assert jobs == [(kept.job_id, {"order_id": kept.id})]


async def test_defer_many_and_a_unique_key_on_a_session(
    app: asyncq.App, sessions: async_sessionmaker[AsyncSession], db: Connection
) -> None:
    confirm = register(app)
    async with sessions() as session, session.begin():
        ids = await confirm.options(conn=session).defer_many([{"order_id": n} for n in (1, 2)])
        first = await confirm.options(conn=session, unique_key="k").defer(3)
        again = await confirm.options(conn=session, unique_key="k").defer(4)
        assert first == again
        await session.rollback()
    assert saved(db) == ([], [])
    async with sessions() as session, session.begin():
        ids = await confirm.options(conn=session).defer_many([{"order_id": n} for n in (1, 2)])
    assert [j[0] for j in saved(db)[1]] == ids


async def test_the_job_goes_to_the_apps_schema(
    asyncq_test_app: asyncq.App,
    sessions: async_sessionmaker[AsyncSession],
    db: Connection,
) -> None:
    """An App with a schema (here the plugin's test schema) writes its job, on the
    session's connection, into its own schema's table: the store qualifies the names."""
    schema = asyncq_test_app.schema
    assert schema is not None
    confirm = register(asyncq_test_app)
    async with sessions() as session, session.begin():
        order = await place(confirm, session, "book")
    jobs = f'"{schema}".asyncq_jobs'
    assert saved(db, jobs) == (
        [(order.id, "book", order.job_id)],
        [(order.job_id, {"order_id": order.id})],
    )
    assert saved(db)[1] == [], "nothing in the search path's asyncq_jobs"
    drained = await drain(asyncq_test_app)
    assert drained.done == 1


# -- AsyncConnection, scoped sessions, subclasses ------------------------------


async def test_an_async_connection_joins_or_begins_its_transaction(
    app: asyncq.App, engine: AsyncEngine, db: Connection
) -> None:
    confirm = register(app)
    async with engine.connect() as conn:
        assert not conn.in_transaction()
        await confirm.options(conn=conn).defer(1)
        assert conn.in_transaction()
        await conn.rollback()
        await conn.execute(text("INSERT INTO sqla_orders (item) VALUES ('book')"))
        job_id = await confirm.options(conn=conn).defer(2)
        await conn.commit()
    assert saved(db) == ([(1, "book", None)], [(job_id, {"order_id": 2})])

    async with engine.begin() as conn:
        await confirm.options(conn=conn).defer(3)
        await conn.execute(text("INSERT INTO sqla_orders (item) VALUES ('pen')"))
        await conn.rollback()
    assert len(saved(db)[1]) == 1


class OwnSession(AsyncSession):
    """A subclass from outside SQLAlchemy, as SQLModel's AsyncSession is."""


async def test_a_scoped_session_and_a_subclass_of_asyncsession(
    app: asyncq.App, engine: AsyncEngine, db: Connection
) -> None:
    confirm = register(app)
    # One scope for the whole test: what a per-task or per-request scope gives a handler.
    scoped = async_scoped_session(
        async_sessionmaker(engine, class_=OwnSession), scopefunc=lambda: "test"
    )
    assert isinstance(scoped(), OwnSession)
    await place(confirm, scoped(), "book")
    await confirm.options(conn=scoped).defer(0)
    await scoped.commit()
    await scoped.remove()
    orders, jobs = saved(db)
    assert [o[1] for o in orders] == ["book"]
    assert [j[1] for j in jobs] == [{"order_id": orders[0][0]}, {"order_id": 0}]


# -- refused -----------------------------------------------------------------


async def test_an_asyncpg_engine_is_refused_before_the_session_begins(
    app: asyncq.App, dsn: str, orders: None
) -> None:
    pytest.importorskip("asyncpg", reason="asyncpg comes with the test extra")
    confirm = register(app)
    engine = create_async_engine(url(dsn, "asyncpg"))
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(TypeError, match=r"postgresql\+asyncpg.*postgresql\+psycopg://"):
                await confirm.options(conn=session).defer(1)
            assert not session.in_transaction()
            async with engine.connect() as conn:
                with pytest.raises(TypeError, match=r"postgresql\+psycopg://"):
                    await confirm.options(conn=conn).defer(1)
                assert not conn.in_transaction()
    finally:
        await engine.dispose()


async def test_sync_and_async_objects_are_refused_on_the_wrong_side(
    app: asyncq.App, engine: AsyncEngine, dsn: str, db: Connection
) -> None:
    confirm = register(app)
    sync_engine = create_engine(url(dsn))
    try:
        with Session(sync_engine) as session:
            with pytest.raises(TypeError, match=r"synchronous SQLAlchemy Session.*defer_sync"):
                await confirm.options(conn=session).defer(1)
            with pytest.raises(TypeError, match=r"defer_sync"):
                await confirm.options(conn=scoped_session(sessionmaker(sync_engine))).defer(1)
            assert not session.in_transaction()
        async with AsyncSession(engine) as async_session:
            with pytest.raises(TypeError, match=r"asyncio SQLAlchemy AsyncSession.*await"):
                connections.sync_connection(async_session)
            # A Session under an AsyncSession's run_sync is on a psycopg AsyncConnection.
            with pytest.raises(TypeError, match=r"runs on a psycopg AsyncConnection.*await"):
                await async_session.run_sync(connections.sync_connection)
        with pytest.raises(TypeError, match=r"engine, which has no transaction"):
            await confirm.options(conn=engine).defer(1)
        with pytest.raises(TypeError, match=r"engine, which has no transaction"):
            connections.sync_connection(sync_engine)
    finally:
        sync_engine.dispose()
    assert saved(db) == ([], [])


# -- Session and Connection (defer_sync) -------------------------------------


@pytest.fixture
def sync_engine(dsn: str, orders: None) -> Iterator[Engine]:
    made = create_engine(url(dsn))
    yield made
    made.dispose()


def place_sync(task: asyncq.Task[[int], None], session: Session, item: str) -> Order:
    order = Order(item=item)
    session.add(order)
    session.flush()
    order.job_id = task.options(conn=session).defer_sync(order.id)
    return order


def test_a_session_commits_or_rolls_back_its_job_with_its_orders(
    dsn: str, sync_engine: Engine, db: Connection
) -> None:
    confirm = register(asyncq.App(dsn))  # defer_sync on a caller's connection: no pool
    sessions = sessionmaker(sync_engine, expire_on_commit=False)
    with sessions() as session, session.begin():
        order = place_sync(confirm, session, "book")
        assert saved(db) == ([], [])
    assert saved(db) == (
        [(order.id, "book", order.job_id)],
        [(order.job_id, {"order_id": order.id})],
    )
    xmins = db.execute(
        "SELECT (SELECT xmin::text FROM sqla_orders), (SELECT xmin::text FROM asyncq_jobs)"
    ).fetchone()
    assert xmins is not None and xmins[0] == xmins[1], "one transaction wrote both"

    with sessions() as session:
        place_sync(confirm, session, "pen")
        session.rollback()
    with pytest.raises(RuntimeError, match="after the defer"), sessions.begin() as session:
        place_sync(confirm, session, "lamp")
        raise RuntimeError("after the defer")
    with sessions() as session:
        # Not begun: the defer begins the session's transaction; closed without a commit.
        assert not session.in_transaction()
        confirm.options(conn=session).defer_sync(0)
        assert session.in_transaction()
    assert [o[1] for o in saved(db)[0]] == ["book"]
    assert len(saved(db)[1]) == 1


def test_a_connection_and_a_scoped_session(dsn: str, sync_engine: Engine, db: Connection) -> None:
    confirm = register(asyncq.App(dsn))
    with sync_engine.connect() as conn:
        assert not conn.in_transaction()
        confirm.options(conn=conn).defer_sync(1)
        assert conn.in_transaction()
        conn.rollback()
        job_id = confirm.options(conn=conn).defer_sync(2)
        conn.commit()
    assert saved(db) == ([], [(job_id, {"order_id": 2})])

    # Flask-SQLAlchemy's db.session is a scoped_session.
    scoped = scoped_session(sessionmaker(sync_engine))
    place_sync(confirm, scoped(), "book")
    confirm.options(conn=scoped).defer_sync(0)
    scoped.commit()
    scoped.remove()
    orders, jobs = saved(db)
    assert [o[1] for o in orders] == ["book"]
    assert [j[1] for j in jobs] == [{"order_id": 2}, {"order_id": orders[0][0]}, {"order_id": 0}]


def test_a_psycopg2_engine_is_refused_before_the_session_begins(
    dsn: str, orders: None, db: Connection
) -> None:
    pytest.importorskip("psycopg2", reason="psycopg2 comes with the test extra")
    confirm = register(asyncq.App(dsn))
    engine = create_engine(url(dsn, "psycopg2"))
    try:
        with Session(engine) as session:
            with pytest.raises(TypeError, match=r"postgresql\+psycopg2.*postgresql\+psycopg://"):
                confirm.options(conn=session).defer_sync(1)
            assert not session.in_transaction()
            session.execute(text("INSERT INTO sqla_orders (item) VALUES ('book')"))
            session.commit()  # the session is as it was: usable
        with engine.connect() as conn:
            with pytest.raises(TypeError, match=r"postgresql\+psycopg://"):
                confirm.options(conn=conn).defer_sync(1)
            assert not conn.in_transaction()
    finally:
        engine.dispose()
    assert saved(db) == ([(1, "book", None)], [])
