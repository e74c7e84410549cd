"""The sweep: after a call of the worker's was cut at its deadline, every idle connection
of its pools (its own and the App's) makes a round trip at once, and the LISTEN
connection checks its own health.

A call cut at its deadline says that its connection was dead without a word (a proxy
that hung, a pooler that lost its server), and the other connections, made the same
way, are likely as dead: left to be found one call at a time, each would cost a service
(or a task's defer, on the App's pool) its deadline in turn. Swept together, the dead
ones are cut at once (their pool replaces them) while the live ones answer in
milliseconds. The round trips have a
`Pace` of their own; a sweep's own cuts do not call for another, and sweeps come at most
every `asyncq.pools.FLOOR` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq.pools import DEADLINE, FLOOR, Pace, connection, on_cut
from asyncq.transient import TRANSIENT_ERRORS

logger = logging.getLogger("asyncq.worker")


class Sweep:
    name = "sweep"

    def __init__(
        self,
        *,
        pools: Sequence[AsyncConnectionPool],
        also: Sequence[Callable[[], None]] = (),
        pace: Pace | None = None,
    ) -> None:
        self.pools = list(pools)
        self.also = list(also)  # told at each sweep: the listener's check
        # An empty statement's round trip: short before any is known.
        self.pace = pace or Pace(DEADLINE, first=FLOOR)
        self.sweeps = 0
        self.dead = 0  # connections the sweeps found dead
        self._cut = anyio.Event()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        stops = [on_cut(pool, self._told) for pool in self.pools]
        task_status.started()
        try:
            while True:
                await self._cut.wait()
                await self.sweep()
                await anyio.sleep(FLOOR)
        finally:
            for stop in stops:
                stop()

    def _told(self) -> None:
        self._cut.set()

    async def sweep(self) -> None:
        for told in self.also:
            told()
        dead_before = self.dead
        async with anyio.create_task_group() as probes:
            for pool in self.pools:
                for _ in range(pool.get_stats().get("pool_available", 0)):
                    probes.start_soon(self._probe, pool)
        self._cut = anyio.Event()  # the probes' own cuts call for no other sweep
        self.sweeps += 1
        if self.dead > dead_before:
            logger.warning(
                "%d idle connections gave no answer: replaced",
                self.dead - dead_before,
                extra={"action": "dead_connections"},
            )

    async def _probe(self, pool: AsyncConnectionPool) -> None:
        try:
            async with connection(pool, self.pace) as conn:
                await conn.execute("")
        except TRANSIENT_ERRORS:
            self.dead += 1
