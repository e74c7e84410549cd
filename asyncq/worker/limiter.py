"""The limiter: keeps the limits the claims enforce up to date with the overrides kept in
the database (``asyncq_limits``, written by `App.set_limits` and ``asyncq limits``).

It reads the overrides as the worker starts, whenever the listener hears that they
changed (the notification the writes send as they commit) or has just (re)connected, and
every minute besides, for a notification lost all the same (without a listener, every
poll interval). Each read is of the whole table
(a row per task or queue overridden). When the limits in force change, the producer's
claims take them from their next claim on: a task limited in code, or by an override,
is claimed by the limited claim; when no task is limited any more, the plain claim.

It reads the tasks whose jobs are deferred in groups too (``asyncq_fair_tasks``, told
on the same channel as a task's first grouped defer commits): the limited claim takes
their grouped jobs round-robin over the groups, by the turns the defers gave them.

A role that may not read the table (a worker granted before it existed) keeps the
limits in code, with a warning once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq import pools
from asyncq.limits import ClaimLimits, Override, Sourced, TaskLimits, with_overrides
from asyncq.store import Store
from asyncq.transient import TRANSIENT_ERRORS, is_transient
from asyncq.worker.observer import Observer
from asyncq.worker.services import Tries
from asyncq.worker.wakeup import Wakeup

logger = logging.getLogger("asyncq.worker")


class Limiter:
    name = "limiter"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        tasks: Sequence[tuple[str, str, TaskLimits]],
        apply: Callable[[ClaimLimits | None], None],
        poll_interval: float,
        observer: Observer,
        rate_limits: bool = True,
        schema: str | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.tasks = list(tasks)  # name, queue, limits in code
        self.apply = apply
        self.poll_interval = poll_interval
        self.observer = observer
        self.rate_limits = rate_limits  # False: the claims leave rate limits out
        self.wakeup = Wakeup()
        self.overrides: list[Override] = []
        self.names = {name for name, _, _ in self.tasks}
        self.fair: set[str] = set()  # tasks of this App deferred in groups: claimed by turns
        self.in_force: dict[str, Sourced] = {}
        self._refused = False
        self.schema = schema  # where to look for asyncq_jobs_ready_by_task (None: do not)

    def changed(self) -> None:
        """The overrides may have changed (a notification, a listener that reconnected):
        read them again now."""
        self.wakeup.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        tries = Tries(self.name, self.observer)
        try:
            await self._read()
        except TRANSIENT_ERRORS as exc:  # the code's limits meanwhile; the loop tries again
            if not is_transient(exc):
                raise
            tries.wait_after(exc, 0.0)
            self.wakeup.set()
        task_status.started()
        while True:
            await self.wakeup.wait(self.poll_interval)
            try:
                await self._read()
            except TRANSIENT_ERRORS as exc:
                if not is_transient(exc):
                    raise
                await anyio.sleep(tries.wait_after(exc))
                self.wakeup.set()
            else:
                tries.succeeded()

    async def _read(self) -> None:
        if self._refused:
            return
        try:
            with anyio.CancelScope(shield=True):
                async with pools.connection(self.pool) as conn:
                    overrides = await self.store.list_limits(conn)
                    fair = set(await self.store.fair_tasks(conn)) & self.names
                    if fair and self.schema is not None:
                        schema, self.schema = self.schema, None  # looked for once
                        if not await self.store.has_ready_by_task(conn, schema):
                            logger.warning(
                                "tasks %s are deferred in groups, but %s.asyncq_jobs_ready_by_task"
                                " is missing: each claim may read every ready job;"
                                " docs/how-to/limits.md says how to make it",
                                ", ".join(sorted(fair)),
                                schema,
                                extra={"action": "index_missing"},
                            )
        except psycopg.errors.InsufficientPrivilege as exc:
            self._refused = True
            logger.warning(
                "this worker may not read the limits kept in the database (%s): it keeps"
                " the limits in code (docs/least-privilege.md has the grant)",
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                extra={"action": "limits_refused"},
            )
            return
        if overrides != self.overrides or fair != self.fair or not self.in_force:
            self.overrides = overrides
            self._set(overrides, fair)

    def _set(self, overrides: list[Override], fair: set[str]) -> None:
        found = dict(with_overrides(self.tasks, overrides))
        if found == self.in_force and fair == self.fair:
            return
        first = not self.in_force
        self.in_force = found
        self.fair = fair
        claimed = ClaimLimits.of(
            (
                (name, s.limits if self.rate_limits else s.limits.without_rate())
                for name, s in found.items()
            ),
            fair=fair,
        )
        self.apply(claimed)
        self.observer.limits_changed(found, at_start=first)
