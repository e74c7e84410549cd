"""Maintenance: work on the shared table that one worker at a time should do.

`gated` runs a piece of work behind the gate; the scheduler (`scheduler.py`) uses it
when a slot is due.

Every worker runs a `Maintainer` with the same list of `Maintenance` pieces; each
pass of a piece runs in a transaction of its own behind one gate, a transaction-level
advisory lock named for the piece and the schema: the worker that takes it does the
pass, the others skip it. A pass that did a full batch runs again at once, in a new
transaction, so that no lock is held for long.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.store import Conn, Store
from asyncq.worker.observer import Observer
from asyncq.worker.services import every

PASS_DEADLINE = 30.0

T = TypeVar("T")


async def gated(
    pool: AsyncConnectionPool,
    store: Store,
    *,
    name: str,
    schema: str,
    work: Callable[[Conn], Awaitable[T]],
    deadline: float | pools.Pace = PASS_DEADLINE,
) -> tuple[bool, T | None]:
    """``work(conn)`` in a transaction that holds the gate ``name`` of ``schema``:
    (True, its result); (False, None) without running it when another session holds it."""
    async with pools.connection(pool, deadline) as conn:
        # Once begun, a pass ends before a shutdown's cancellation reaches it (a
        # transaction cut short would cost the connection), within its deadline.
        with anyio.CancelScope(shield=True):
            async with conn.transaction():
                locked = await store.try_lock(conn, name=name, schema=schema)
                done = await work(conn) if locked else None
    return locked, done


class Maintenance(Protocol):
    name: str
    interval: float

    async def run(self, conn: Conn) -> bool:
        """One pass, inside the gate's transaction; True if there may be more to do now."""
        ...


class Maintainer:
    name = "maintenance"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        schema: str,
        pieces: Sequence[Maintenance],
        observer: Observer,
    ) -> None:
        self.pool = pool
        self.store = store
        self.schema = schema
        self.pieces = list(pieces)
        self.observer = observer
        self._due = dict.fromkeys((p.name for p in self.pieces), 0.0)
        # Each piece at the pace of its own passes: a rescue takes milliseconds, a prune
        # of a large backlog may take seconds.
        self._paces = {p.name: pools.Pace(PASS_DEADLINE) for p in self.pieces}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await every(self.name, self._until_next, self._due_passes, self.observer)

    def _until_next(self) -> float:
        return max(0.0, min(self._due.values()) - anyio.current_time())

    async def _due_passes(self) -> None:
        for piece in self.pieces:
            now = anyio.current_time()
            if self._due[piece.name] > now:
                continue
            self._due[piece.name] = now + piece.interval
            while await self.gated(piece):
                pass

    async def gated(self, piece: Maintenance) -> bool:
        """One pass of ``piece`` if no other worker runs one now; True if there is more."""
        _, more = await gated(
            self.pool,
            self.store,
            name=piece.name,
            schema=self.schema,
            work=piece.run,
            deadline=self._paces[piece.name],
        )
        return bool(more)
