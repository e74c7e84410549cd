"""Helpers for testing code that uses asyncq: run jobs to the end, assert on what was
deferred, or run tasks inline without a database.

With a database (the pytest plugin's ``asyncq_test_app`` fixture gives each test an App
bound to an empty schema of its own, see `asyncq.testing.plugin`)::

    await signup("ada@example.com")           # code that defers jobs
    await assert_deferred(send_welcome, email="ada@example.com")
    result = await drain(app)                  # run them, retries included, no sleeping
    assert result.failed_attempts == 0

Without one (`inline`): deferring runs the task at once, in the caller, after its
arguments made the same JSON round trip they make in production::

    with inline(app) as queue:
        await send_welcome.defer(email="ada@example.com")
    assert queue.jobs[0].status == "done"

`drain`, `deferred_jobs`, `assert_deferred` and `assert_not_deferred` work in both
modes: while `inline` is active for a task's App, they read its inline jobs.

Workflows run in both: steps run once, sleeps are moved forward rather than slept, and a
job that waits for an event waits until the test emits it::

    order_id = await place_order.defer(7)      # steps, a sleep, then a wait
    left = await drain(app, allow_waiting=True)
    assert [job.event for job in left.waiting] == ["paid:7"]
    await app.emit_event("paid:7", {"amount": 12})
    await drain(app)                            # it goes on from its wait, to its end
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from asyncq import codec, workflow
from asyncq.control import JobControl
from asyncq.errors import AsyncqError, NotInWorkflow
from asyncq.job import Job
from asyncq.task import JobWriter, Task
from asyncq.worker.executor import Executor
from asyncq.worker.observer import LogObserver, WorkerStats
from asyncq.worker.outcomes import Kind, Stop, decide
from asyncq.worker.threads import Threads
from asyncq.workflow import Ending, Spawn, Wait
from asyncq.writer import Writer

if TYPE_CHECKING:
    from psycopg import AsyncConnection, Connection

    from asyncq.app import App
    from asyncq.store import NewJob

__all__ = [
    "DeferredJob",
    "DrainIncomplete",
    "DrainResult",
    "InlineJob",
    "InlineQueue",
    "WaitingJob",
    "assert_deferred",
    "assert_not_deferred",
    "deferred_jobs",
    "drain",
    "inline",
]

DEFAULT_MAX_PASSES = 25


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitingJob:
    """A job left waiting when `drain` ended: ``waiting_for`` says for what, as the
    table's column does: ``event:<key>`` (an event not emitted), ``jobs`` (a gather of
    jobs that have not ended) or ``after`` (its ``after=`` jobs), with ``on`` the jobs it
    waits for; ``run_at`` is when it comes due anyway (a wait's timeout), None: never."""

    id: int
    task_name: str
    waiting_for: str
    on: tuple[int, ...] = ()
    run_at: datetime | None = None

    @property
    def event(self) -> str | None:
        """The key of the event it waits for (None when it waits for no event)."""
        if self.waiting_for.startswith(_EVENT):
            return self.waiting_for[len(_EVENT) :]
        return None

    def describe(self) -> str:
        """What it waits for, for a message."""
        what = f"#{self.id} ({self.task_name}) waits "
        if self.event is not None:
            what += f"for the event {self.event!r}"
            if self.run_at is not None:
                what += f" (its timeout at {self.run_at.isoformat()})"
            return what
        if self.waiting_for in ("jobs", "after"):
            how = "its gather" if self.waiting_for == "jobs" else "after="
            return what + f"for job(s) {_ids(self.on)} to end ({how})"
        return what + f"for its {self.waiting_for}"


_EVENT = "event:"


class DrainIncomplete(AsyncqError):
    """`drain` could not run every job to its end: after its last pass jobs were still
    waiting for a retry, a snooze or a sleep, jobs ready to run were left queued (in a
    paused queue, or kept back by a limit that jobs running elsewhere hold), or jobs were
    left waiting for an event no one emitted, or for jobs that did not end (``.waiting``:
    each `WaitingJob`)."""

    def __init__(self, message: str | None = None, *, waiting: Sequence[WaitingJob] = ()) -> None:
        super().__init__(message)
        self.waiting = tuple(waiting)


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainResult:
    """What `drain` did: worker passes made, and the attempts of all of them
    (``suspended``: the runs that ended in a sleep or a wait); ``waiting``, the jobs
    left waiting (with ``allow_waiting=True`` only: otherwise drain raises)."""

    passes: int
    claimed: int = 0
    done: int = 0
    failed_attempts: int = 0
    snoozed: int = 0
    cancelled: int = 0
    suspended: int = 0
    waiting: tuple[WaitingJob, ...] = ()

    def add(self, stats: WorkerStats) -> DrainResult:
        """This result with one more pass, whose worker's statistics are ``stats``."""
        return DrainResult(
            passes=self.passes + 1,
            claimed=self.claimed + stats.claimed,
            done=self.done + stats.done,
            failed_attempts=self.failed_attempts + stats.failed_attempts,
            snoozed=self.snoozed + stats.snoozed,
            cancelled=self.cancelled + stats.cancelled,
            suspended=self.suspended + stats.suspended,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class DeferredJob:
    """A job as the assertions see it: its row, or its inline record. ``args`` are the
    stored arguments, decoded from JSON (a tuple argument reads back as a list)."""

    id: int
    task_name: str
    queue: str
    args: dict[str, Any]
    status: str
    priority: int
    run_at: datetime | None
    attempts: int
    max_attempts: int
    last_error: str | None = None


async def drain(
    app: App,
    *,
    queues: Sequence[str] | None = None,
    scheduled: bool = False,
    timeouts: bool = False,
    allow_waiting: bool = False,
    max_passes: int = DEFAULT_MAX_PASSES,
    concurrency: int = 10,
) -> DrainResult:
    """Run every ready job of ``app``'s schema to its end, in this process, with a real
    worker (``app.run_worker(drain=True)``); then move time forward and go again, until
    no job waits for time. It returns only once no job in its queues is ready, or raises.

    After each pass, the jobs queued for a retry or a snooze (queued again after a
    claim) are made due now, instead of being slept through: a task that fails for
    ever ends ``failed`` after its ``max_attempts`` passes, with no wait for its
    backoff. Sleeps are ended the same way: a job that sleeps (``ctx.sleep``,
    ``ctx.sleep_until``) is queued, the end its sleep recorded moved to now, and its
    next run goes on past the sleep, its steps returning their stored results (one
    pass per sleep). Rate limits are lifted, for the same reason: drain's worker claims
    as though no task had one (none of its starts count against a later worker's rate).
    ``concurrency`` and ``group_concurrency`` limits hold: drain runs those jobs as the
    limits let it, without waiting for time. Jobs deferred with a ``delay`` or
    ``run_at`` in the future are left alone, unless ``scheduled`` is true (then they
    run too). ``queues`` narrows the worker and the time moves to those queues.

    Workflows run through: children spawned and the jobs they wake, gathers, jobs
    deferred ``after=`` others, a job woken by an event that a job emits. A wait for an
    event is not timed out early: emit the event in the test (``app.emit_event``) and
    drain again, which runs its job; with ``timeouts``, the waits that have a timeout
    are timed out at once instead (the wait raises `asyncq.EventTimeout`).

    `DrainIncomplete`, naming the jobs, when work is left: a job still waiting after
    ``max_passes`` passes (a task that snoozes or sleeps for ever); a ready job in a
    paused queue (resume it, or leave it out of ``queues``); a ready job that a pass did
    not claim (a ``concurrency`` or ``group_concurrency`` limit held by jobs running on
    another worker); once nothing can run, a job left waiting for an event that was not
    emitted, or for jobs that did not end (a gather of such a job, ``after=`` a job that
    waits, or one in a queue not drained): the exception's ``waiting`` lists each, as
    a `WaitingJob`. With ``allow_waiting``, drain returns instead, those jobs in the
    result's ``waiting``: a test that emits the event later, or asserts on the wait.

    While `inline` is active for the App, runs its inline jobs instead, the same way
    (`InlineQueue.run_pending`), ``max_passes`` passes at most.
    """
    if max_passes < 1:
        raise ValueError(f"max_passes must be at least 1, not {max_passes!r}")
    queue = _inline_queues.get(app)
    if queue is not None:
        return await queue.drain(max_passes, timeouts=timeouts, allow_waiting=allow_waiting)
    result = DrainResult(passes=0)
    moved: list[int] = []
    left: list[int] = []
    opened_here = not app.is_open  # else each pass of run_worker would open and close it
    if opened_here:
        await app.open()
    try:
        for _ in range(max_passes):
            stats = await app._run_worker(
                queues,
                {"drain": True, "handle_signals": False, "concurrency": concurrency},
                rate_limits=False,
            )
            result = result.add(stats)
            async with app.writer.connection() as conn:
                ready = await app.store.testing_left_ready(conn, queues=queues)
                moved = await app.store.testing_advance(
                    conn, scheduled=scheduled, timeouts=timeouts, queues=queues
                )
            paused = sorted({name for _, name, is_paused in ready if is_paused})
            if paused:
                held = [job_id for job_id, _, is_paused in ready if is_paused]
                raise DrainIncomplete(
                    f"job(s) {_ids(held)} are ready in the paused queue(s) {paused}: resume"
                    " them, or name the queues to drain (drain(app, queues=[...]))"
                )
            # Ready through a whole pass that claimed nothing (not only come due since).
            before = set() if stats.claimed else set(left)
            stuck = [job_id for job_id, _, _ in ready if job_id in before]
            if stuck:
                raise DrainIncomplete(
                    f"job(s) {_ids(stuck)} are ready but drain's worker could not claim them:"
                    " a concurrency or group_concurrency limit held by jobs running"
                    " elsewhere?"
                )
            left = [job_id for job_id, _, _ in ready]
            if not left and not moved:
                async with app.writer.connection() as conn:
                    rows = await app.store.testing_waiting(conn, queues=queues)
                waiting = tuple(
                    WaitingJob(id=i, task_name=t, waiting_for=w, run_at=r, on=tuple(on))
                    for i, t, w, r, on in rows
                )
                return _ended(result, waiting, allow_waiting)
            scheduled = False  # what was due later has run once: from now on, retries only
    finally:
        if opened_here:
            await app.close()
    raise DrainIncomplete(
        f"drain made {max_passes} passes and job(s) {_ids(sorted({*moved, *left}))} still"
        " wait for a retry, a snooze or a sleep, or to run (a task that snoozes or sleeps"
        " for ever?); raise max_passes if more passes are expected"
    )


def _ended(result: DrainResult, waiting: tuple[WaitingJob, ...], allow: bool) -> DrainResult:
    """``result``, with the jobs left ``waiting`` (`DrainIncomplete` unless ``allow``)."""
    if waiting and not allow:
        shown = "; ".join(job.describe() for job in waiting[:20])
        more = f"; ... ({len(waiting)} in all)" if len(waiting) > 20 else ""
        raise DrainIncomplete(
            f"drain ran every job it could, and job(s) {_ids([j.id for j in waiting])} are"
            f" left waiting: {shown}{more}. Emit the events the test expects"
            " (app.emit_event) and drain again, or pass allow_waiting=True to have them in"
            " the result's waiting",
            waiting=waiting,
        )
    return replace(result, waiting=waiting)


def _ids(ids: Sequence[int], shown: int = 20) -> str:
    """``ids`` for a message: the first ``shown`` of them."""
    if len(ids) <= shown:
        return str(list(ids))
    return "[" + ", ".join(map(str, ids[:shown])) + f", ... ({len(ids)} in all)]"


# -- what was deferred ---------------------------------------------------------------


async def deferred_jobs(task: Task[Any, Any]) -> list[DeferredJob]:
    """Every job of ``task`` in its App's schema (or inline queue), whatever its status,
    oldest first."""
    writer = task.writer
    if isinstance(writer, InlineQueue):
        return [job.as_deferred() for job in writer.jobs if job.task_name == task.name]
    if not isinstance(writer, Writer):
        raise TypeError(f"{task!r} writes its jobs with {writer!r}, which asyncq cannot read")
    async with writer.connection() as conn:
        rows = await writer.store.testing_jobs_of_task(conn, task=task.name)
    return [
        DeferredJob(
            id=int(row[0]),
            task_name=row[1],
            queue=row[2],
            args=codec.decode(row[3]),
            status=row[4],
            priority=row[5],
            run_at=row[6],
            attempts=row[7],
            max_attempts=row[8],
            last_error=row[9],
        )
        for row in rows
    ]


def _expected(task: Task[Any, Any], args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` as they read back after their JSON round trip (a tuple is a list)."""
    try:
        return dict(codec.decode(codec.to_json(dict(args))))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the arguments to look for in {task.name} are not JSON: {exc}") from None


def _matches(job: DeferredJob, expected: Mapping[str, Any]) -> bool:
    return all(name in job.args and job.args[name] == value for name, value in expected.items())


def _describe(jobs: Sequence[DeferredJob]) -> str:
    return "\n".join(f"  #{job.id} {job.status} {codec.to_json(job.args)}" for job in jobs)


async def assert_deferred(task: Task[Any, Any], /, **args: Any) -> DeferredJob:
    """Assert a job of ``task`` was deferred whose arguments include ``args`` (compared
    after their JSON round trip; arguments not named are not compared); returns the
    first such job. The failure lists the task's jobs that were deferred."""
    expected = _expected(task, args)
    jobs = await deferred_jobs(task)
    for job in jobs:
        if _matches(job, expected):
            return job
    wanted = f" with arguments {codec.to_json(expected)}" if expected else ""
    if not jobs:
        raise AssertionError(f"no job of {task.name} was deferred (expected one{wanted})")
    raise AssertionError(
        f"no job of {task.name} was deferred{wanted}; its {len(jobs)} job(s):\n{_describe(jobs)}"
    )


async def assert_not_deferred(task: Task[Any, Any], /, **args: Any) -> None:
    """Assert no job of ``task`` was deferred whose arguments include ``args`` (with no
    ``args``: no job of ``task`` at all)."""
    expected = _expected(task, args)
    found = [job for job in await deferred_jobs(task) if _matches(job, expected)]
    if found:
        wanted = f" with arguments {codec.to_json(expected)}" if expected else ""
        raise AssertionError(
            f"expected no job of {task.name}{wanted}; found {len(found)}:\n{_describe(found)}"
        )


# -- inline mode ---------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class InlineJob:
    """A job deferred in `inline` mode: its arguments as stored (JSON text) and where its
    runs left it, as the table would say: ``queued`` (not run yet, or waiting for a
    retry or a snooze), ``waiting`` (for an event, for other jobs: ``waiting_for`` and
    ``waiting_on`` say which, as `WaitingJob` does), ``done``, ``failed`` or
    ``cancelled`` (deferred ``after=`` a job that did not end done); ``result`` is what
    the task returned as a worker stores it (its JSON, decoded: a tuple reads back as a
    list), or None with ``unstored`` saying why when a worker would not store it (not
    JSON, too large); ``error`` is what the last attempt raised, ``last_error`` the text
    the table would keep. ``steps`` are the results its steps recorded, by name and
    number (asyncq's own too: a sleep's ``asyncq.sleep``, a wait's ``asyncq.wait:<key>``,
    the children's ids under ``asyncq.spawn:<task>``); ``parent_id`` the job that
    spawned it; ``claims`` its runs, suspended ones included; ``progress`` what its task
    reported last (``ctx.progress``), as the row keeps it."""

    id: int
    task_name: str
    queue: str
    stored_args: str
    priority: int
    run_at: datetime | None
    delay: float
    max_attempts: int
    attempts: int = 0
    claims: int = 0
    status: str = "queued"
    result: Any = None
    unstored: str | None = None
    error: BaseException | None = None
    last_error: str | None = None
    waiting_for: str | None = None
    waiting_on: list[int] = field(default_factory=list)
    parent_id: int | None = None
    after: tuple[int, ...] = ()
    on_parent_failure: str = "cancel"
    stored_steps: dict[tuple[str, int], str] = field(default_factory=dict)
    progress: dict[str, Any] | None = None
    # Queued for a retry or a snooze, or from synchronous code under an event loop: it
    # waits for `drain` (a worker would wait for its run_at), not for the next defer.
    due_later: bool = False

    @property
    def args(self) -> dict[str, Any]:
        """The arguments as the task gets them: the stored JSON, decoded."""
        return dict(codec.decode(self.stored_args))

    @property
    def steps(self) -> dict[tuple[str, int], Any]:
        """The results its steps recorded, decoded, by (name, number)."""
        return {key: codec.decode(text) for key, text in self.stored_steps.items()}

    def as_deferred(self) -> DeferredJob:
        """This job as the assertions see it (`deferred_jobs`)."""
        return DeferredJob(
            id=self.id,
            task_name=self.task_name,
            queue=self.queue,
            args=self.args,
            status=self.status,
            priority=self.priority,
            run_at=self.run_at,
            attempts=self.attempts,
            max_attempts=self.max_attempts,
            last_error=self.last_error,
        )

    def as_waiting(self) -> WaitingJob:
        """This job as `drain` reports a job left waiting."""
        return WaitingJob(
            id=self.id,
            task_name=self.task_name,
            waiting_for=self.waiting_for or "",
            on=tuple(self.waiting_on),
            run_at=self.run_at,
        )


_LIVE = frozenset({"queued", "running", "waiting"})


@dataclass(kw_only=True)
class InlineQueue:
    """The `JobWriter` of an App's tasks in `inline` mode: keeps every job in ``jobs``;
    with ``run``, runs each at once, before its ``defer`` returns, and then what it made
    ready (see `inline`). Its `emit_event` stands in for the App's while inline."""

    app: App
    run: bool
    raise_errors: bool
    max_args_bytes: int
    jobs: list[InlineJob] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # A plain def task runs in a thread, as on a worker, in the job's context.
    _threads: Threads = field(default_factory=lambda: Threads(1, name="asyncq-inline"))
    _by_id: dict[int, InlineJob] = field(default_factory=dict)
    _events: dict[str, str] = field(default_factory=dict)  # key -> payload, as JSON
    _running: int = 0  # attempts in progress (a task that defers runs one inside another)
    _outcomes: Counter[Kind] = field(default_factory=Counter)

    def write(self, job: NewJob) -> Awaitable[int]:
        """A ``defer`` on the App's pool: records the job (and runs it, with ``run``)."""
        return self._write(job, job.args)

    async def write_alone(
        self, job: NewJob, *, conn: AsyncConnection[Any] | None, unique_key: str | None
    ) -> int:
        """A ``defer`` with ``conn`` or ``unique_key``: both are ignored inline."""
        return await self._write(job, job.args)

    async def write_many(self, jobs: NewJob, *, conn: AsyncConnection[Any] | None) -> list[int]:
        """A ``defer_many``: one job per set of arguments, each as `write` does."""
        return [await self._write(jobs, codec.to_json(args)) for args in codec.decode(jobs.args)]

    async def write_after(
        self,
        jobs: NewJob,
        *,
        after: list[int],
        failure: str,
        conn: AsyncConnection[Any] | None,
    ) -> list[int]:
        """A defer with ``after``: the jobs wait until those end, then run (or are
        cancelled), as in the table."""
        live = [job_id for job_id in dict.fromkeys(after) if self._live(job_id)]
        records = []
        for args in codec.decode(jobs.args):
            record = self._record(jobs, codec.to_json(args))
            record.after, record.on_parent_failure = tuple(after), failure
            if live:
                record.waiting_on = list(live)
                self._suspend(record, "after", None)
            else:
                self._after_ended(record)
            records.append(record)
        if self.run and not self._running:
            await self._follow()
        return [record.id for record in records]

    def write_sync(
        self, job: NewJob, *, conn: Connection[Any] | None, unique_key: str | None
    ) -> int:
        """A ``defer_sync``: runs the job at once where no event loop runs, else leaves
        it for `drain`."""
        # From synchronous code the job runs at once only where no event loop runs (a
        # script, a thread); under one (a sync function called by async code), it waits
        # for `drain` or `run_pending`.
        record = self._record(job, job.args)
        if self.run and not _loop_running():
            asyncio.run(self._run_and_follow(record))
        else:
            record.due_later = True
        return record.id

    async def _write(self, job: NewJob, stored_args: str) -> int:
        record = self._record(job, stored_args)
        if self.run:
            await self._run_and_follow(record)
        return record.id

    async def _run_and_follow(self, record: InlineJob) -> None:
        await self._run(record)
        if not self._running:  # else the defer is a task's: what follows runs after it
            await self._follow()

    def _record(self, job: NewJob, stored_args: str) -> InlineJob:
        return self._add(
            InlineJob(
                id=next(self._ids),
                task_name=job.task_name,
                queue=job.queue,
                stored_args=stored_args,
                priority=job.priority,
                run_at=job.run_at,
                delay=job.delay,
                max_attempts=job.max_attempts,
            )
        )

    def _add(self, record: InlineJob) -> InlineJob:
        self.jobs.append(record)
        self._by_id[record.id] = record
        return record

    async def emit_event(self, key: str, payload: Any = None, *, conn: Any = None) -> bool:
        """`App.emit_event` in inline mode (``app.emit_event`` is this one while `inline`
        is active): the first emit of ``key`` is kept (True; a later one returns False),
        a wait that starts later returns its payload at once, and the jobs waiting for it
        are queued: with ``run``, they run before this returns (when a task emits, after
        its attempt). ``conn`` is ignored."""
        text = workflow.event_json(key, payload)
        if key in self._events:
            return False
        self._events[key] = text
        for job in self.jobs:
            if job.status == "waiting" and job.waiting_for == _EVENT + key:
                self._wake(job)
        if self.run and not self._running:
            await self._follow()
        return True

    async def run_pending(
        self, max_passes: int = DEFAULT_MAX_PASSES, *, timeouts: bool = False
    ) -> int:
        """Run the queued jobs (those they defer, spawn and wake, and their retries,
        snoozes and sleeps, moved forward) until none is queued; returns how many
        attempts ran. Jobs waiting for an event stay waiting (with ``timeouts``, the waits
        that have a timeout time out). `DrainIncomplete` after ``max_passes`` passes over
        them."""
        ran, _ = await self._drain_passes(max_passes, timeouts=timeouts)
        return ran

    async def drain(
        self,
        max_passes: int = DEFAULT_MAX_PASSES,
        *,
        timeouts: bool = False,
        allow_waiting: bool = False,
    ) -> DrainResult:
        """`asyncq.testing.drain` of the inline jobs (`run_pending`, then the jobs left
        waiting: `DrainIncomplete`, unless ``allow_waiting``)."""
        before = Counter(self._outcomes)
        ran, passes = await self._drain_passes(max_passes, timeouts=timeouts)
        kinds = self._outcomes - before
        result = DrainResult(
            passes=passes,
            claimed=ran,
            done=kinds[Kind.DONE],
            failed_attempts=kinds[Kind.RETRY] + kinds[Kind.FAIL],
            snoozed=kinds[Kind.SNOOZE],
            suspended=kinds[Kind.SUSPEND],
        )
        waiting = tuple(job.as_waiting() for job in self.jobs if job.status == "waiting")
        return _ended(result, waiting, allow_waiting)

    async def _drain_passes(self, max_passes: int, *, timeouts: bool) -> tuple[int, int]:
        ran, passes, left = await self._settle(max_passes, retries=True, timeouts=timeouts)
        if left:
            raise DrainIncomplete(
                f"drain made {max_passes} passes over the inline jobs and job(s)"
                f" {_ids([job.id for job in left])} still wait for a retry, a snooze or a"
                " sleep (a task that snoozes or sleeps for ever?)"
            )
        return ran, passes

    async def _follow(self) -> None:
        """With ``run``, after a defer or an emit: run what is ready (children, jobs
        woken), sleeps moved forward; not the retries and snoozes, which wait for drain.
        A job that sleeps for ever is left sleeping after `DEFAULT_MAX_PASSES` runs."""
        await self._settle(DEFAULT_MAX_PASSES, retries=False)

    async def _settle(
        self, passes: int, *, retries: bool, timeouts: bool = False
    ) -> tuple[int, int, list[InlineJob]]:
        """Passes of: move time forward (`_move_time`), then run the ready jobs until none
        is; until no job waits for time, ``passes`` at most. Returns the attempts run,
        the passes made, and the jobs still waiting for time."""
        ran = 0
        left: list[InlineJob] = []
        for made in range(1, passes + 1):
            self._move_time(retries=retries, timeouts=timeouts)
            ran += await self._run_ready()
            left = [job for job in self.jobs if self._waits_for_time(job, retries, timeouts)]
            if not left:
                return ran, made, []
        return ran, passes, left

    async def _run_ready(self) -> int:
        ran = 0
        while ready := [job for job in self.jobs if job.status == "queued" and not job.due_later]:
            for job in ready:
                if job.status == "queued" and not job.due_later:  # not run meanwhile
                    await self._run(job)
                    ran += 1
        return ran

    def _waits_for_time(self, job: InlineJob, retries: bool, timeouts: bool) -> bool:
        if job.status == "queued":
            return retries and job.due_later
        if job.status != "waiting":
            return False
        if job.waiting_for == "sleep":
            return True
        if job.run_at is None:  # an event with no timeout, or jobs
            return False
        return timeouts or job.run_at <= datetime.now(UTC)

    def _move_time(self, *, retries: bool, timeouts: bool) -> None:
        """Make the time the jobs wait for come: a sleep's end (its recorded end moved to
        now, so that the job's next run finds it over, as `drain` does in the table);
        with ``retries``, a retry's or a snooze's; with ``timeouts``, a wait's timeout."""
        now = datetime.now(UTC)
        for job in self.jobs:
            if not self._waits_for_time(job, retries, timeouts):
                continue
            if job.status == "waiting":
                assert job.waiting_for is not None
                name = workflow.SLEEP
                if job.waiting_for.startswith(_EVENT):
                    name = workflow.WAIT + job.waiting_for[len(_EVENT) :]
                ended = codec.to_json({"until": now.isoformat()})
                for key, text in job.stored_steps.items():
                    until = _until(text) if key[0] == name else None
                    if until is not None and until > now:
                        job.stored_steps[key] = ended
                self._wake(job)
            job.due_later = False

    # -- what the jobs' workflows change ------------------------------------------------

    def _live(self, job_id: int) -> bool:
        job = self._by_id.get(job_id)
        return job is not None and job.status in _LIVE

    def _suspend(
        self, job: InlineJob, waiting_for: str, until: datetime | None
    ) -> tuple[str, str | None, datetime | None]:
        job.status, job.waiting_for, job.run_at = "waiting", waiting_for, until
        return "waiting", None, until

    def _wake(self, job: InlineJob) -> None:
        job.status, job.waiting_for, job.waiting_on = "queued", None, []
        job.run_at = datetime.now(UTC)

    def _ended(self, ended: InlineJob) -> None:
        """``ended`` has ended: the jobs that waited for it and now wait for nothing are
        woken (one deferred after it is cancelled, when it did not end done and that one
        runs only after success), and those cancelled so wake theirs in turn."""
        gone = [ended.id]
        while gone:
            job_id = gone.pop()
            for job in self.jobs:
                if job.status != "waiting" or job_id not in job.waiting_on:
                    continue
                job.waiting_on.remove(job_id)
                if job.waiting_on:
                    continue
                if job.waiting_for == "jobs":
                    self._wake(job)
                elif self._after_ended(job) == "cancelled":
                    gone.append(job.id)

    def _after_ended(self, job: InlineJob) -> str:
        """``job``, deferred after jobs that have all ended: queued, or cancelled when one
        did not end done and it runs only after success. Returns its status."""
        failed = sorted(
            (parent.id, parent.status)
            for parent in map(self._by_id.get, job.after)
            if parent is not None and parent.status in ("failed", "cancelled")
        )
        if failed and job.on_parent_failure == "cancel":
            job.status, job.waiting_for, job.waiting_on = "cancelled", None, []
            job.last_error = (
                f"Cancelled: it runs after job {failed[0][0]}, which ended {failed[0][1]}"
            )
        else:
            self._wake(job)
        return job.status

    # -- one attempt ----------------------------------------------------------------------

    async def _run(self, record: InlineJob) -> None:
        """One run, ended as a worker would end it (`outcomes.decide`): what it raises,
        `CancelledError` and other `BaseException` included, fails the attempt; what it
        returns is kept as the JSON the worker would store, decoded; a sleep or a wait
        leaves it waiting, the attempt not counted."""
        task = self.app.tasks.get(record.task_name)
        executor = Executor(
            tasks=self.app.tasks,
            worker="inline",
            threads=self._threads,
            middleware=self.app.middlewares,
            gateway=_InlineGateway(self, record),
        )
        record.attempts += 1
        record.claims += 1
        record.due_later = False
        job = Job(
            record.id,
            record.task_name,
            record.queue,
            record.stored_args,
            record.attempts,
            record.max_attempts,
            record.claims,
        )
        record.status = "running"
        caller = asyncio.current_task()
        self._running += 1
        try:
            result = await executor.run(job, task)
        except BaseException as exc:
            # The caller cancelled, not the task: handed back, as by a worker's shutdown.
            stop = Stop.SHUTDOWN if caller is not None and caller.cancelling() else None
            outcome = decide(job, task, error=exc, stop=stop)
            assert outcome is not None  # no lease to lose inline
            self._outcomes[outcome.kind] += 1
            if outcome.kind is Kind.SUSPEND:  # waiting (or woken again since)
                record.attempts -= 1
                _log.finished(outcome, record.status)
                return
            record.status = "failed" if outcome.kind is Kind.FAIL else "queued"
            if outcome.kind in (Kind.SNOOZE, Kind.RELEASE):
                record.attempts -= 1  # the attempt does not count
            record.due_later = outcome.kind in (Kind.RETRY, Kind.SNOOZE)
            if stop is None:
                record.error, record.last_error = exc, outcome.error or record.last_error
            _log.finished(outcome, record.status)
            if record.status == "failed":
                self._ended(record)
            if stop is not None or (self.raise_errors and not isinstance(exc, JobControl)):
                raise
        else:
            outcome = decide(job, task, result=result)
            assert outcome is not None
            self._outcomes[outcome.kind] += 1
            record.result = None if outcome.result is None else codec.decode(outcome.result)
            record.unstored = outcome.unstored
            record.status = "done"
            _log.finished(outcome, record.status)
            self._ended(record)
        finally:
            self._running -= 1


class _InlineGateway:
    """The `asyncq.workflow.Gateway` of an inline run: its job's steps, sleeps, waits and
    children kept in the `InlineQueue`; a step's transaction on the App's pool."""

    __slots__ = ("_in_transaction", "queue", "record")

    def __init__(self, queue: InlineQueue, record: InlineJob) -> None:
        self.queue = queue
        self.record = record
        self._in_transaction: tuple[str, int, str] | None = None

    async def load_steps(self, job: Job) -> dict[tuple[str, int], str | None]:
        return dict(self.record.stored_steps)

    async def write_step(
        self, job: Job, name: str, seq: int, result: str, started: datetime
    ) -> tuple[str, str | None]:
        stored = self.record.stored_steps.setdefault((name, seq), result)
        return ("written", None) if stored is result else ("exists", stored)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        app = self.queue.app
        if not app.is_open:
            raise NotInWorkflow(
                f"ctx.step_tx in {self.record.task_name} needs a database connection: inline"
                " mode gives it one of the App's pool, in a transaction, once the App is open"
                " (async with app, or the asyncq_test_app fixture); or test the task with"
                " drain"
            )
        self._in_transaction = None
        async with app.pool.connection() as conn, conn.transaction():
            yield conn
        if self._in_transaction is not None:  # committed: the step is recorded with it
            name, seq, result = self._in_transaction
            self.record.stored_steps.setdefault((name, seq), result)

    async def write_step_in(
        self,
        conn: AsyncConnection[Any],
        job: Job,
        name: str,
        seq: int,
        result: str,
        started: datetime,
    ) -> tuple[str, str | None]:
        stored = self.record.stored_steps.get((name, seq))
        if stored is not None:
            return "exists", stored
        self._in_transaction = (name, seq, result)
        return "written", None

    async def suspend(self, job: Job, wait: Wait) -> tuple[str, str | None, datetime | None]:
        queue, record = self.queue, self.record
        now = datetime.now(UTC)
        until = wait.until
        if until is None and wait.seconds is not None:
            until = now + timedelta(seconds=wait.seconds)
        if wait.step is not None:
            stored = {"until": None if until is None else until.isoformat()}
            record.stored_steps.setdefault((wait.step, wait.seq), codec.to_json(stored))
        if wait.kind == "sleep":
            assert until is not None
            if until <= now:
                return "due", None, until
            return queue._suspend(record, "sleep", until)
        if wait.kind == "event":
            assert wait.key is not None
            payload = queue._events.get(wait.key)
            if payload is not None:
                return "emitted", payload, until
            if until is not None and until <= now:
                return "timeout", None, until
            return queue._suspend(record, _EVENT + wait.key, until)
        live = [job_id for job_id in wait.awaited if queue._live(job_id)]
        if not live:
            return "ended", None, None
        record.waiting_on = live
        return queue._suspend(record, "jobs", None)

    async def spawn(self, job: Job, spawn: Spawn) -> list[int] | None:
        record = self.record
        stored = record.stored_steps.get((spawn.step, spawn.seq))
        if stored is not None:
            return [int(job_id) for job_id in codec.decode(stored)]
        ids = [
            self.queue._add(
                InlineJob(
                    id=next(self.queue._ids),
                    task_name=spawn.task_name,
                    queue=spawn.queue,
                    stored_args=codec.to_json(args),
                    priority=spawn.priority,
                    run_at=None,
                    delay=0.0,
                    max_attempts=spawn.max_attempts,
                    parent_id=record.id,
                )
            ).id
            for args in codec.decode(spawn.args)
        ]
        record.stored_steps[(spawn.step, spawn.seq)] = codec.to_json(ids)
        return ids

    async def endings(self, ids: Sequence[int]) -> list[Ending]:
        found = []
        for job_id in ids:
            job = self.queue._by_id.get(job_id)
            if job is not None:
                result = None if job.result is None else codec.to_json(job.result)
                found.append(Ending(job.id, job.status, result, job.last_error))
        return found

    def suspended(self, job: Job) -> None:
        pass

    def lost(self, job: Job, why: str) -> None:
        pass  # never: an inline job has no lease

    def report_progress(self, job: Job, progress: str) -> None:
        self.record.progress = codec.decode(progress)


def _until(step: str) -> datetime | None:
    """The end a sleep or a wait recorded as its step (None: none)."""
    value = codec.decode(step)
    until = value.get("until") if isinstance(value, dict) else None
    return datetime.fromisoformat(until) if isinstance(until, str) else None


_log = LogObserver()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


_inline_queues: weakref.WeakKeyDictionary[App, InlineQueue] = weakref.WeakKeyDictionary()


@contextmanager
def inline(app: App, *, run: bool = True, raise_errors: bool = True) -> Iterator[InlineQueue]:
    """Within the block, ``app``'s tasks write no job rows: each ``defer``,
    ``options(...).defer`` and ``defer_many`` encodes its arguments as in production
    (a value that is not JSON raises `TypeError` at the defer), decodes them again and
    records the job in the queue's ``jobs``.

    With ``run`` (the default), the job's first attempt runs at once, before ``defer``
    returns: in the caller's task, through the App's middleware, with `current_job`
    set. It ends as a worker would end it: ``done``, its result kept as a worker stores
    it (the JSON round trip: a tuple reads back as a list; a result a worker would not
    store, a set say, is None, with the reason in the job's ``unstored`` and the
    worker's warning logged); ``failed`` (`asyncq.Discard`, ``retry_on``, the last
    attempt); or ``queued`` again for a retry or a snooze, which ``await drain(app)``
    runs (at once: time is not waited for inline). Whatever the task raises fails the
    attempt, ``asyncio.CancelledError`` and other ``BaseException`` included (a
    cancellation of the caller itself is not the task's: it hands the job back to the
    queue and propagates). An exception other than asyncq's signals (`Retry`, `Snooze`,
    `Discard`) also propagates from ``defer`` (or `drain`), unless
    ``raise_errors=False``. A ``delay`` or ``run_at`` is
    recorded, not waited for; ``conn`` and ``unique_key`` are ignored; ``timeout`` is
    not enforced. With ``run=False``, jobs are only collected until `drain` runs them.
    Tasks registered on the App inside the block are not affected.

    Workflows run as a worker runs them, in memory. Steps run for real and are kept on
    the job (``steps``); a run that sleeps ends there and the job runs again from the
    top at once, the sleep's end moved forward (its steps return their stored results);
    a retry runs again the same way. ``ctx.step_tx`` gets a connection of the App's pool
    in a transaction when the App is open (else `asyncq.NotInWorkflow`). ``app.emit_event``
    is the queue's `InlineQueue.emit_event` within the block: ``ctx.wait_for_event``
    returns an event emitted before, else the job waits (``waiting``) until one is, and
    the emit runs it. Children (``ctx.spawn``, ``spawn_many``) are inline jobs that run
    once their parent's run has ended (suspended at its ``gather``, say), then the
    parent again; ``gather`` returns their results or raises `asyncq.ChildFailed`. A job
    deferred ``options(after=[...])`` waits until those end, then runs (or is
    ``cancelled``, as in the table). With ``run``, all of that runs before the defer (or
    the emit) returns; otherwise `drain` runs it. A job that sleeps for ever is left
    ``waiting`` after 25 runs, for `drain` to report."""
    queue = InlineQueue(
        app=app, run=run, raise_errors=raise_errors, max_args_bytes=app.max_args_bytes
    )
    tasks = list(app.tasks.values())
    saved: list[JobWriter] = [task.writer for task in tasks]
    for task in tasks:
        task.writer = queue
    _inline_queues[app] = queue
    # The App's emits go to the queue's events, as its tasks' defers go to its jobs.
    app.emit_event = queue.emit_event  # type: ignore[method-assign]
    try:
        yield queue
    finally:
        queue._threads.close()
        for task, writer in zip(tasks, saved, strict=True):
            task.writer = writer
        _inline_queues.pop(app, None)
        del app.emit_event
