"""The producer: claims jobs in batches sized to the free slots and hands them to the
dispatcher.

A notification, a job coming due or the poll timer wakes it; a full batch means more
work is likely waiting, so it claims again as soon as enough slots are free.

When the slots hold two batches, two claim loops run, each on its own connection,
so that one claim's round trip overlaps the jobs of the other's batch. A loop takes
its slots before it claims and gives back those its claim did not fill. Only the
first loop polls; a wake-up, or a full batch claimed by its sibling, wakes the second.

A claim has the pace of the claims before it (`asyncq.pools.Pace`): one that takes
milliseconds and has no answer after two seconds is looked at, on a new connection
(`at_work`): if the server is not at work on it (its connection is stuck: a proxy
that hung, say), it is cut then and claimed again, on another connection; if it is,
it has its whole deadline. A claim cut after its commit would leave its jobs to their
lease: only a claim the server no longer runs is cut early.

With priority aging on, while the claims come back full (work is being left behind),
a claim now and then first takes the jobs whose priority has aged past the top one's
(`Store.claim_aged`), and the plain or limited claim the rest of the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import anyio
import anyio.lowlevel
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from asyncq.job import Job
from asyncq.limits import ClaimLimits
from asyncq.pools import DEADLINE, FLOOR, KeptConnection, Pace
from asyncq.store import Conn, Store
from asyncq.transient import TRANSIENT_ERRORS, is_transient
from asyncq.worker.completer import Completer
from asyncq.worker.observer import Observer
from asyncq.worker.services import Tries
from asyncq.worker.slots import Slots
from asyncq.worker.wakeup import Wakeup

CLAIM_DEADLINE = DEADLINE
LOOK_DEADLINE = FLOOR  # a look at a claim: a new connection and one round trip
# With priority aging, the aged claim goes before the plain one at most this often (or
# every --priority-aging seconds, if that is shorter).
AGED_EVERY = 1.0


class Hold(Protocol):
    """The dispatcher's `hold_many`: run jobs just claimed (``first``: before those
    waiting)."""

    def __call__(self, jobs: Sequence[Job], sent: float, *, first: bool = ...) -> None: ...


class Producer:
    name = "claim"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        worker: str,
        queues: Sequence[str] | None,
        lease: timedelta,
        batch_size: int,
        slots: Slots,
        wakeup: Wakeup,
        poll_interval: float,
        hold: Hold,
        is_idle: Callable[[], bool],
        drain: bool,
        observer: Observer,
        claim_loops: int = 1,
        limits: ClaimLimits | None = None,
        priority_aging: float = 0.0,
        completer: Completer | None = None,
        connect: Callable[[], Awaitable[AsyncConnection[Any]]] | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.worker = worker
        self.queues = list(queues) if queues else None
        self.lease = lease
        self.batch_size = batch_size
        self.slots = slots
        self.wakeup = wakeup
        self.poll_interval = poll_interval
        self.hold = hold
        self.is_idle = is_idle
        self.drain = drain
        self.observer = observer
        self.connect = connect  # a new connection, outside the pool, for a look
        self.pace = Pace(CLAIM_DEADLINE)
        # When busy, wait for half a batch of free slots rather than claiming one job at a
        # time (or for half the slots, with the jobs held ahead, if they hold less).
        self.refill_at = max(1, batch_size // 2)
        self.loops = claim_loops
        # With limited tasks, every claim is the limited one (serialised in the schema),
        # which takes their jobs for free runners only: one claimed ahead would wait for a
        # runner while it counted against its task's limit. Without, the plain one.
        self.limits = limits
        self.limited_names = frozenset(limits.names) if limits is not None else frozenset()
        # The plain claim also writes the plain done outcomes waiting: while a claim is
        # out, or about to go out without waiting, they wait for it (`claim_coming`).
        # Not the limited claim: its lock is held through its commit, and the done write
        # (with its announcement to result waiters) there made every claim's turn longer
        # than the outcome writer's own statement beside it (benchmarks/README.md).
        self._completer = completer
        self.completer = completer if limits is None else None
        # Tasks this worker does not know, found by claiming their jobs: its plain claims
        # skip them, for a worker that knows them (their jobs are given back meanwhile).
        self.skip: set[str] = set()
        # Priority aging (seconds a level; 0: off): while the claims come back full, lower
        # priorities may be left behind for good; now and then, the aged claim first takes
        # those that have waited long enough (store.claim_aged). Not limited or fair
        # tasks' jobs: the aged claim knows no limits and no turns.
        self.priority_aging = priority_aging
        self.backed_up = False  # the last claim came back full
        self.aged_at = 0.0  # the loop's clock at the last aged claim
        self.claiming = 0  # claim loops whose claim is out or goes out at once
        self.taken_out = 0  # slots taken by the claims out
        self.limited_out = 0  # limited tasks' jobs the claims out may take
        if completer is not None:
            completer.claim_coming = lambda: self.claiming > 0 and self.completer is not None

    def set_limits(self, limits: ClaimLimits | None) -> None:
        """Claim with ``limits`` from the next claim on (the limits in force changed at
        runtime): the limited claim while any task is limited, else the plain one."""
        self.limits = limits
        self.limited_names = frozenset(limits.names) if limits is not None else frozenset()
        self.completer = self._completer if limits is None else None
        if self._completer is not None:
            self._completer.kick()  # its done outcomes no longer wait for a limited claim

    async def run(self) -> None:
        """Claim until cancelled; in drain mode, return once nothing is ready or running."""
        async with anyio.create_task_group() as loops:
            for number in range(self.loops):
                loops.start_soon(self._claim_loop, number)

    async def _claim_loop(self, number: int) -> None:
        if self.connect is None:  # no look: a claim has its whole deadline
            kept = KeptConnection(self.pool, deadline=CLAIM_DEADLINE)
        else:
            kept = KeptConnection(self.pool, deadline=self.pace, look=self._look)
        try:
            await self._claim_until_done(kept, polls=number == 0)
        finally:
            await kept.release()

    async def _claim_until_done(self, kept: KeptConnection, *, polls: bool) -> None:
        active = False

        def claiming(now: bool) -> None:
            """Whether this loop's next claim is out, or goes out without waiting."""
            nonlocal active
            if now is not active:
                active = now
                self.claiming += 1 if now else -1
                if not self.claiming and self.completer is not None:
                    self.completer.kick()

        try:
            await self._claim_while_ready(kept, polls=polls, claiming=claiming)
        finally:
            claiming(False)

    async def _claim_while_ready(
        self, kept: KeptConnection, *, polls: bool, claiming: Callable[[bool], None]
    ) -> None:
        tries = Tries(self.name, self.observer)
        idle_seen = False
        slots = self.slots
        while True:
            # While full batches come back, nothing below waits outside the claim's shield:
            # a stop (the cancel of the claim loops) is taken here, between two claims.
            await anyio.lowlevel.checkpoint_if_cancelled()
            claiming(slots.enough(self.refill_at))
            await slots.wait_free(self.refill_at)
            claiming(True)
            want = min(slots.free, self.batch_size)
            limited = self._limited(want)
            ended, writes = slots.ended, slots.writes
            slots.take(want)
            self.taken_out += want
            self.limited_out += limited
            began = anyio.current_time()
            try:
                try:
                    jobs, sent = await self._claim(kept, want, limited)
                finally:
                    self.taken_out -= want
                    self.limited_out -= limited
            except TRANSIENT_ERRORS as exc:
                if not is_transient(exc):
                    raise
                slots.unclaimed(want)
                claiming(False)
                await tries.failed(exc)
                continue
            tries.succeeded()
            self.backed_up = len(jobs) == want
            slots.unclaimed(want - len(jobs))
            if jobs:
                self.observer.claimed(jobs, anyio.current_time() - began)
                self._hold(jobs, sent)
            if len(jobs) == want:
                # More is likely waiting: claim again at once (the runners start these
                # jobs while that claim is out), and a sibling loop may claim it too.
                self.wakeup.nudge()
                continue
            claiming(False)
            await asyncio.sleep(0)  # the runners start their jobs before we wait
            if self._cut_short(jobs, limited, want) and (jobs or not self.is_idle()):
                # Limited tasks' jobs were taken for the free runners only, as many as
                # those: more may be ready. Look again once a job ends (or at the poll).
                idle_seen = False
                with anyio.move_on_after(self.poll_interval):
                    await slots.wait_ended(ended)
                continue
            if self.limits is not None and (slots.used or slots.unwritten):
                # A limit (a task's, or a group's, across the fleet) may have held back
                # ready jobs: the jobs running count against it until their outcomes are
                # written. Look again after the next write (or at the poll), not only at
                # the poll: else a group limited to N runs N jobs a poll interval.
                idle_seen = False
                with anyio.move_on_after(self.poll_interval):
                    await slots.wait_written(writes)
                continue
            if self.drain:
                if not jobs and self.is_idle():
                    if idle_seen:
                        return
                    # An outcome written while that claim ran may have made a job ready
                    # (a retry): claim once more, now that every write has ended.
                    idle_seen = True
                    continue
                idle_seen = False
                await self.wakeup.wait(min(self.poll_interval, 0.05))
            else:
                await self.wakeup.wait(self.poll_interval if polls else None)

    def _limited(self, want: int) -> int:
        """How many of ``want`` jobs a claim may take of limited tasks: as many as runners
        are free, less those that the claims out may take."""
        if self.limits is None:
            return want
        in_hand = self.slots.used - self.taken_out  # running, or held for a runner
        return max(0, min(want, self.slots.total - in_hand - self.limited_out))

    def _cut_short(self, jobs: list[Job], limited: int, want: int) -> bool:
        """Whether a claim that took fewer than ``want`` jobs may have left limited tasks'
        jobs for want of free runners: it took as many of them as it was allowed."""
        if self.limits is None or limited >= want:
            return False
        names = self.limited_names
        return sum(job.task_name in names for job in jobs) >= limited

    def _hold(self, jobs: list[Job], sent: float) -> None:
        """Hand ``jobs`` to the runners, limited tasks' first (claimed for free runners,
        they wait behind no job held ahead)."""
        names = self.limited_names
        if names:
            limited = [job for job in jobs if job.task_name in names]
            if limited:
                self.hold(limited, sent, first=True)
                jobs = [job for job in jobs if job.task_name not in names]
        if jobs:
            self.hold(jobs, sent)

    async def _look(self, conn: Conn) -> bool:
        """Whether the server is still at work on the claim that ``conn`` waits for: asked
        on a new connection (the pool's may be as stuck as this one)."""
        assert self.connect is not None
        info = conn.info
        pid, name = info.backend_pid, info.parameter_status("application_name")
        async with asyncio.timeout(LOOK_DEADLINE):
            async with await self.connect() as fresh:
                return await self.store.at_work(fresh, pid=pid, application_name=name)

    async def _claim(
        self, kept: KeptConnection, limit: int, limited: int
    ) -> tuple[list[Job], float]:
        """The jobs claimed, and when the claim was sent (the loop's clock, the dispatcher's
        self-fence's): read once the connection is there, just before the statement, so
        no later than the database locks the rows (a connection that took long to come,
        after a silence say, does not count against the lease)."""
        # Shielded: a claim cancelled after it committed would leave its jobs running with
        # nobody to run them until their lease expired. Stopping waits for it instead, up
        # to its deadline: past that its connection is cut, and a claim that committed all
        # the same (only its answer was lost) leaves its jobs to their lease.
        with anyio.CancelScope(shield=True):
            async with kept.connection() as conn:
                sent = asyncio.get_running_loop().time()
                aged = await self._claim_aged(conn, limit, sent)
                if len(aged) == limit:
                    return aged, sent
                try:
                    jobs = await self._claim_rest(conn, limit - len(aged), limited)
                except TRANSIENT_ERRORS as exc:
                    # The aged jobs are claimed (committed): run them, and let the next
                    # claim meet the error, rather than leave them to their lease.
                    if aged and is_transient(exc):
                        return aged, sent
                    raise
        return aged + jobs if aged else jobs, sent

    async def _claim_rest(self, conn: Conn, limit: int, limited: int) -> list[Job]:
        """The plain claim (writing the done outcomes waiting, if any) or the limited one."""
        completer = self.completer
        plain = completer.take_plain() if completer is not None else None
        if plain:
            assert completer is not None
            try:
                jobs, written = await self.store.claim_writing_done(
                    conn,
                    worker=self.worker,
                    limit=limit,
                    queues=self.queues,
                    lease=self.lease,
                    done=[o.job for o in plain],
                    skip=sorted(self.skip) if self.skip else None,
                )
            except BaseException:
                completer.give_back(plain)  # written or not: the fence tells
                raise
            completer.written_by_claim(plain, written)
        elif self.limits is not None:
            jobs = await self.store.claim_limited(
                conn,
                worker=self.worker,
                limit=limit,
                queues=self.queues,
                lease=self.lease,
                limits=self.limits,
                limited=min(limited, limit),
            )
        else:
            jobs = await self.store.claim(
                conn,
                worker=self.worker,
                limit=limit,
                queues=self.queues,
                lease=self.lease,
                skip=sorted(self.skip) if self.skip else None,
            )
        return jobs

    async def _claim_aged(self, conn: Conn, limit: int, now: float) -> list[Job]:
        """The jobs that aging puts ahead of the plain claim's, if it is time to look."""
        aging = self.priority_aging
        if not aging or not self.backed_up:
            return []
        if now < self.aged_at + min(AGED_EVERY, aging):
            return []
        self.aged_at = now
        return await self.store.claim_aged(
            conn,
            worker=self.worker,
            limit=limit,
            queues=self.queues,
            lease=self.lease,
            aging=aging,
            skip=sorted(self.skip | self.limited_names) or None,
        )
