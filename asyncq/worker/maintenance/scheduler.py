"""The scheduler: the App's schedules fire their due slots, one job per slot.

As it starts, the scheduler declares the App's schedules in the table (what each runs
is updated; its last slot is kept; a new one starts at its next slot). It then keeps
every schedule's next slot in memory, against the database's clock (`DatabaseClock`),
and wakes every second, or at the next slot when that is sooner. The database hears
from it only when a slot is due: behind the maintenance gate, one statement
(``fire_schedules``) fires every due schedule, and the database fences each slot so
that it makes one job however many workers try. A schedule whose slots were missed
(its workers were down) fires only the latest of them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.schedule import Schedule
from asyncq.store import Conn, FireResult, Store
from asyncq.transient import TRANSIENT_ERRORS, is_transient
from asyncq.worker.maintenance import gated
from asyncq.worker.observer import Observer
from asyncq.worker.services import Tries, retrying

TICK = 1.0
# A slot not yet settled (the gate was taken, or the database's clock is not there yet)
# is asked about again this much later.
RETRY = 0.1
# Wake this long after a slot by the estimated clock, so as not to come just before it.
LATE_BY = 0.005
CLOCK_REFRESH = 60.0


class DatabaseClock:
    """The database's time, read without a round trip: the local monotonic clock plus
    the offset measured by `measure` (at the middle of its round trip)."""

    def __init__(self, refresh: float = CLOCK_REFRESH) -> None:
        self.refresh = refresh
        self._origin: datetime | None = None  # the database's time at monotonic() == 0
        self._measured_at = 0.0

    @property
    def stale(self) -> bool:
        return self._origin is None or time.monotonic() - self._measured_at > self.refresh

    async def measure(self, conn: Conn, store: Store) -> None:
        before = time.monotonic()
        now = await store.database_clock(conn)
        after = time.monotonic()
        self._origin = now - timedelta(seconds=(before + after) / 2)
        self._measured_at = after

    def now(self) -> datetime:
        assert self._origin is not None, "measure the clock first"
        return self._origin + timedelta(seconds=time.monotonic())


class Scheduler:
    name = "scheduler"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        schema: str,
        schedules: Sequence[Schedule],
        observer: Observer,
        clock: DatabaseClock | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.schema = schema
        self.schedules = {s.name: s for s in schedules}
        self.observer = observer
        self.clock = clock or DatabaseClock()
        self.upcoming: dict[str, datetime] = {}  # each schedule's next slot to fire
        self._unsettled = False

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await retrying(self.name, self.declare, self.observer)
        tries = Tries(self.name, self.observer)
        while True:
            await anyio.sleep(self._until_next())
            try:
                await self.tick()
            except TRANSIENT_ERRORS as exc:
                if not is_transient(exc):
                    raise
                await tries.failed(exc)
            else:
                tries.succeeded()

    async def declare(self) -> None:
        """Write the App's schedules to the table and learn their last slots."""
        async with pools.connection(self.pool) as conn:
            await self.clock.measure(conn, self.store)
            async with conn.transaction():
                await self.store.limit_idle(conn)
                last = await self.store.declare_schedules(
                    conn, schedules=list(self.schedules.values()), now=self.clock.now()
                )
        self.upcoming = {
            name: schedule.cron.next_after(last[name]) for name, schedule in self.schedules.items()
        }

    def _until_next(self) -> float:
        if self._unsettled:
            return RETRY
        if not self.upcoming or self.clock.stale:
            return TICK
        ahead = (min(self.upcoming.values()) - self.clock.now()).total_seconds()
        return max(0.0, min(TICK, ahead + LATE_BY))

    def due(self, now: datetime) -> list[tuple[Schedule, datetime]]:
        """Each schedule whose next slot has come, with its latest slot at ``now``."""
        return [
            (schedule, schedule.cron.latest(now))
            for name, schedule in self.schedules.items()
            if self.upcoming[name] <= now
        ]

    async def tick(self) -> list[FireResult]:
        """Fire what is due now; the results of the fire (none when nothing was due or
        another worker held the gate)."""
        if self.clock.stale:
            async with pools.connection(self.pool) as conn:
                await self.clock.measure(conn, self.store)
        due = self.due(self.clock.now())
        self._unsettled = False
        if not due:
            return []
        passed, results = await gated(
            self.pool,
            self.store,
            name=self.name,
            schema=self.schema,
            work=lambda conn: self.store.fire_schedules(conn, due=due),
        )
        if not passed or results is None:
            self._unsettled = True  # another worker is firing: see what it left
            return []
        slots = {schedule.name: slot for schedule, slot in due}
        for result in results:
            slot = slots[result.schedule]
            if result.job_id is not None:
                self.observer.fired(result.schedule, slot, result.job_id)
            if result.settled:
                self.upcoming[result.schedule] = self.schedules[result.schedule].cron.next_after(
                    slot
                )
            else:
                self._unsettled = True
        return results
