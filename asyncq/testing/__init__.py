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
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from asyncq import codec
from asyncq.control import JobControl
from asyncq.errors import AsyncqError, NotInWorkflow
from asyncq.job import Job
from asyncq.task import JobWriter, Task
from asyncq.worker.executor import Executor
from asyncq.worker.observer import LogObserver, WorkerStats
from asyncq.worker.outcomes import Kind, Stop, decide
from asyncq.worker.threads import Threads
from asyncq.writer import Writer

if TYPE_CHECKING:
    from psycopg import AsyncConnection, Connection

    from asyncq.app import App
    from asyncq.store import NewJob

__all__ = [
    "DeferredJob",
    "DrainIncomplete",
    "DrainResult",
    "InlineQueue",
    "assert_deferred",
    "assert_not_deferred",
    "deferred_jobs",
    "drain",
    "inline",
]

DEFAULT_MAX_PASSES = 25


class DrainIncomplete(AsyncqError):
    """`drain` could not run every job to its end: after its last pass jobs were still
    waiting for a retry or a snooze, or jobs ready to run were left queued (in a paused
    queue, or kept back by a limit that jobs running elsewhere hold)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainResult:
    """What `drain` did: worker passes made, and the attempts of all of them."""

    passes: int
    claimed: int = 0
    done: int = 0
    failed_attempts: int = 0
    snoozed: int = 0
    cancelled: int = 0

    def add(self, stats: WorkerStats) -> DrainResult:
        return DrainResult(
            passes=self.passes + 1,
            claimed=self.claimed + stats.claimed,
            done=self.done + stats.done,
            failed_attempts=self.failed_attempts + stats.failed_attempts,
            snoozed=self.snoozed + stats.snoozed,
            cancelled=self.cancelled + stats.cancelled,
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
    max_passes: int = DEFAULT_MAX_PASSES,
    concurrency: int = 10,
) -> DrainResult:
    """Run every ready job of ``app``'s schema to its end, in this process, with a real
    worker (``app.run_worker(drain=True)``); then move time forward and go again, until
    no job waits. It returns only once no job in its queues is ready, or raises.

    After each pass, the jobs queued for a retry or a snooze (queued again after a
    claim) are made due now, instead of being slept through: a task that fails for
    ever ends ``failed`` after its ``max_attempts`` passes, with no wait for its
    backoff. Rate limits are lifted, for the same reason: drain's worker claims as
    though no task had one (none of its starts count against a later worker's rate).
    ``concurrency`` and ``group_concurrency`` limits hold: drain runs those jobs as the
    limits let it, without waiting for time. Jobs deferred with a ``delay`` or
    ``run_at`` in the future are left alone, unless ``scheduled`` is true (then they
    run too). ``queues`` narrows the worker and the time moves to those queues.

    `DrainIncomplete`, naming the jobs, when work is left: a job still waiting after
    ``max_passes`` passes (a task that snoozes for ever); a ready job in a paused queue
    (resume it, or leave it out of ``queues``); a ready job that a pass did not claim (a
    ``concurrency`` or ``group_concurrency`` limit held by jobs running on another
    worker).

    While `inline` is active for the App, runs its queued inline jobs instead (their
    retries and snoozes too), ``max_passes`` times over at most.
    """
    if max_passes < 1:
        raise ValueError(f"max_passes must be at least 1, not {max_passes!r}")
    queue = _inline_queues.get(app)
    if queue is not None:
        return DrainResult(passes=1, claimed=await queue.run_pending(max_passes))
    result = DrainResult(passes=0)
    waiting: list[int] = []
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
                waiting = await app.store.testing_advance(conn, scheduled=scheduled, queues=queues)
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
            if not left and not waiting:
                return result
            scheduled = False  # what was due later has run once: from now on, retries only
    finally:
        if opened_here:
            await app.close()
    raise DrainIncomplete(
        f"drain made {max_passes} passes and job(s) {_ids(sorted({*waiting, *left}))} still"
        " wait for a retry or a snooze, or to run (a task that snoozes for ever?); raise"
        " max_passes if more attempts are expected"
    )


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
    attempts left it, as the table would say: ``queued`` (not run yet, or waiting for a
    retry or a snooze), ``done`` or ``failed``; ``result`` is what the task returned as
    a worker stores it (its JSON, decoded: a tuple reads back as a list), or None with
    ``unstored`` saying why when a worker would not store it (not JSON, too large);
    ``error`` is what the last attempt raised, ``last_error`` the text the table would
    keep."""

    id: int
    task_name: str
    queue: str
    stored_args: str
    priority: int
    run_at: datetime | None
    delay: float
    max_attempts: int
    attempts: int = 0
    status: str = "queued"
    result: Any = None
    unstored: str | None = None
    error: BaseException | None = None
    last_error: str | None = None

    @property
    def args(self) -> dict[str, Any]:
        return dict(codec.decode(self.stored_args))

    def as_deferred(self) -> DeferredJob:
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


@dataclass(kw_only=True)
class InlineQueue:
    """The `JobWriter` of an App's tasks in `inline` mode: keeps every job in ``jobs``;
    with ``run``, runs each at once, before its ``defer`` returns."""

    app: App
    run: bool
    raise_errors: bool
    max_args_bytes: int
    jobs: list[InlineJob] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # A plain def task runs in a thread, as on a worker, in the job's context.
    _threads: Threads = field(default_factory=lambda: Threads(1, name="asyncq-inline"))

    def write(self, job: NewJob) -> Awaitable[int]:
        return self._write(job, job.args)

    async def write_alone(
        self, job: NewJob, *, conn: AsyncConnection[Any] | None, unique_key: str | None
    ) -> int:
        return await self._write(job, job.args)

    async def write_many(self, jobs: NewJob, *, conn: AsyncConnection[Any] | None) -> list[int]:
        return [await self._write(jobs, codec.to_json(args)) for args in codec.decode(jobs.args)]

    async def write_after(
        self,
        jobs: NewJob,
        *,
        after: list[int],
        failure: str,
        conn: AsyncConnection[Any] | None,
    ) -> list[int]:
        raise NotInWorkflow("options(after=...) is not run in inline mode: use drain")

    def write_sync(
        self, job: NewJob, *, conn: Connection[Any] | None, unique_key: str | None
    ) -> int:
        # From synchronous code the job runs at once only where no event loop runs (a
        # script, a thread); under one (a sync function called by async code), it waits
        # for `drain` or `run_pending`.
        record = self._record(job, job.args)
        if self.run and not _loop_running():
            asyncio.run(self._run(record))
        return record.id

    async def _write(self, job: NewJob, stored_args: str) -> int:
        record = self._record(job, stored_args)
        if self.run:
            await self._run(record)
        return record.id

    def _record(self, job: NewJob, stored_args: str) -> InlineJob:
        record = InlineJob(
            id=next(self._ids),
            task_name=job.task_name,
            queue=job.queue,
            stored_args=stored_args,
            priority=job.priority,
            run_at=job.run_at,
            delay=job.delay,
            max_attempts=job.max_attempts,
        )
        self.jobs.append(record)
        return record

    async def run_pending(self, max_passes: int = DEFAULT_MAX_PASSES) -> int:
        """Run the queued jobs (those they defer, and their retries and snoozes) until
        none is queued; returns how many attempts ran. `DrainIncomplete` after
        ``max_passes`` passes over them."""
        ran = 0
        for _ in range(max_passes):
            pending = [job for job in self.jobs if job.status == "queued"]
            if not pending:
                return ran
            for job in pending:
                await self._run(job)
                ran += 1
        waiting = [job.id for job in self.jobs if job.status == "queued"]
        if not waiting:
            return ran
        raise DrainIncomplete(
            f"drain made {max_passes} passes over the inline jobs and job(s) {waiting} are"
            " still queued (a task that snoozes for ever?)"
        )

    async def _run(self, record: InlineJob) -> None:
        """One attempt, ended as a worker would end it (`outcomes.decide`): what it
        raises, `CancelledError` and other `BaseException` included, fails the attempt;
        what it returns is kept as the JSON the worker would store, decoded."""
        task = self.app.tasks.get(record.task_name)
        executor = Executor(
            tasks=self.app.tasks,
            worker="inline",
            threads=self._threads,
            middleware=self.app.middlewares,
        )
        record.attempts += 1
        job = Job(
            record.id,
            record.task_name,
            record.queue,
            record.stored_args,
            record.attempts,
            record.max_attempts,
            record.attempts,
        )
        record.status = "running"
        caller = asyncio.current_task()
        try:
            result = await executor.run(job, task)
        except BaseException as exc:
            # The caller cancelled, not the task: handed back, as by a worker's shutdown.
            stop = Stop.SHUTDOWN if caller is not None and caller.cancelling() else None
            outcome = decide(job, task, error=exc, stop=stop)
            assert outcome is not None  # no lease to lose inline
            record.status = "failed" if outcome.kind is Kind.FAIL else "queued"
            if outcome.kind in (Kind.SNOOZE, Kind.RELEASE):
                record.attempts -= 1  # the attempt does not count
            if stop is None:
                record.error, record.last_error = exc, outcome.error or record.last_error
            _log.finished(outcome, record.status)
            if stop is not None or (self.raise_errors and not isinstance(exc, JobControl)):
                raise
        else:
            outcome = decide(job, task, result=result)
            assert outcome is not None
            record.result = None if outcome.result is None else codec.decode(outcome.result)
            record.unstored = outcome.unstored
            record.status = "done"
            _log.finished(outcome, record.status)


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
    Tasks registered on the App inside the block are not affected."""
    queue = InlineQueue(
        app=app, run=run, raise_errors=raise_errors, max_args_bytes=app.max_args_bytes
    )
    tasks = list(app.tasks.values())
    saved: list[JobWriter] = [task.writer for task in tasks]
    for task in tasks:
        task.writer = queue
    _inline_queues[app] = queue
    try:
        yield queue
    finally:
        queue._threads.close()
        for task, writer in zip(tasks, saved, strict=True):
            task.writer = writer
        _inline_queues.pop(app, None)
