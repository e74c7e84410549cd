"""Jobs and their states.

A job moves through these states; every arrow out of ``running`` is written
only by the worker that still holds the job's lease for that claim, or by the
reaper once that lease has expired::

                 claim                    returned
    queued ─────────────▶ running ───────────────────────▶ done
      ▲                    │  │
      │  error or Retry    │  │ error, attempts used up;
      │  (backoff); Snooze;│  │ Discard; undecodable arguments;
      │  lease expired;    │  │ handed back once too often
      │  handed back       │  ▼
      └────────────────────┘ failed ──▶ (a person requeues it, or not)

``cancelled``: a cancel ends a queued or waiting job there at once (and the unfinished
jobs it spawned); for a running one it marks the row, and whatever ends that attempt
(its worker stopping it, a failure, a hand-back, the reaper) ends the job
``cancelled``, not queued again.

``waiting``: a running job that suspends itself (a sleep, a wait for an event, a
gather) waits there, its attempt given back, and a job deferred ``after`` others starts
there; it is never claimed, and becomes ``queued`` when its time comes, its event is
emitted or the jobs it waits for end (or ``cancelled``, after others that did not all
end ``done``, with ``on_parent_failure="cancel"``).

A schedule's slot makes a job like any other, with ``schedule`` and ``scheduled_at`` set.

Every claim of a row adds one to its ``claims``, which nothing resets: the claim a
worker holds a job by is the fence of all its writes for that attempt.
"""

from __future__ import annotations

import contextvars
import enum
import math
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar, overload

from asyncq import codec
from asyncq.errors import NotInJob
from asyncq.workflow import Gateway, Run, sleep_seconds

if TYPE_CHECKING:
    pass

P = ParamSpec("P")
R = TypeVar("R")


# A queued job's priority rises one level for every this many seconds it has been due
# (the worker's --priority-aging; 0 turns aging off).
PRIORITY_AGING = 5.0


class Status(enum.StrEnum):
    """A job's state, the ``status`` column of ``asyncq_jobs``: ``queued``, ``running``,
    ``waiting``, ``done``, ``failed`` or ``cancelled``."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Job(NamedTuple):
    """A claimed job, as the worker runs it (a tuple: made for every job, it costs a
    third of a frozen dataclass). ``args`` is the stored JSON text, decoded when the job
    runs; ``claim`` is the row's claim count, the fence of this attempt's writes;
    ``trace_context`` the JSON object a traced defer wrote (else None)."""

    id: int
    task_name: str
    queue: str
    args: str
    attempt: int
    max_attempts: int
    claim: int
    scheduled_at: datetime | None = None
    trace_context: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class JobContext:
    """What a running task can know about its own job (see `current_job`)."""

    id: int
    """The job's id (``asyncq_jobs.id``, as ``defer`` returned it)."""
    task_name: str
    """The task's name, as stored in the row."""
    queue: str
    """The queue the job was claimed from."""
    attempt: int
    """This attempt's number, from 1."""
    max_attempts: int
    """How many attempts the job may use before it is ``failed``."""
    worker: str
    """The id of the worker running it (the row's ``locked_by``)."""
    scheduled_at: datetime | None = None
    """The slot of the schedule that made this job (None for a job deferred otherwise)."""
    stop_event: threading.Event | None = field(default=None, repr=False, compare=False)
    """Set when the worker stops the attempt of a plain ``def`` task (None otherwise)."""
    workflow: Run | None = field(default=None, repr=False, compare=False)
    """The attempt's steps, sleeps, waits and children (see `asyncq.workflow`)."""
    gateway: Gateway | None = field(default=None, repr=False, compare=False)
    """What the attempt's progress goes through (None: a context made by hand)."""

    @property
    def stop_requested(self) -> bool:
        """True once the worker has stopped this attempt of a plain ``def`` task (its
        timeout, a cancel, a lost lease, a shutdown's grace over): the attempt's outcome
        is already written, and a thread cannot be stopped from outside, so a function
        that runs long looks at this between steps and returns. Always False in an
        ``async def`` task, which is cancelled instead."""
        return self.stop_event is not None and self.stop_event.is_set()

    def progress(self, done: float, message: str | None = None) -> None:
        """Report how far the attempt has got: ``done`` is a fraction from 0.0 to 1.0 (a
        float), or a count of things done (an int); ``message`` a few words (at most
        `MAX_PROGRESS_MESSAGE` characters are kept). It returns at once, in an ``async
        def`` task or a plain ``def`` one: the worker writes the latest report of each job
        a few times a second at most (the last one with the attempt's outcome), fenced
        like every write of a running job, and ``asyncq job`` shows it."""
        text = progress_json(done, message, self.attempt)
        gateway, run = self.gateway, self.workflow
        if gateway is not None and run is not None:
            gateway.report_progress(run.job, text)

    def _run(self) -> Run:
        if self.workflow is None:
            raise NotInJob("this job context has no workflow: it is not a running job's")
        return self.workflow

    # -- steps and durable waits (asyncq.workflow says what runs again) ------------------

    @overload
    async def step(
        self, name: str, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    @overload
    async def step(
        self, name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (a plain function, called on the event loop, or a
        coroutine function) once for this job, and store what it returns (JSON, at most
        1 MiB). When the job runs again (a retry, a hand-back, a crash, a sleep or a wait),
        the step returns the stored result without calling ``fn``: the n-th call of a
        name in a run gets the n-th result stored under that name. It returns what JSON
        gives back (a tuple as a list), the same in every run. A step that raises fails
        the attempt as any error does; the steps that finished are not repeated."""
        return await self._run().step(name, fn, args, kwargs)

    async def step_tx(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """A step whose own SQL commits with its checkpoint, exactly once:
        ``fn(conn, *args, **kwargs)`` gets a psycopg ``AsyncConnection`` of the App's in
        a transaction that also records the step. The transaction commits only while the
        job is still this attempt's; otherwise (a lost lease) it rolls back and the
        attempt ends. When the job runs again, the step returns its stored result."""
        return await self._run().step_tx(name, fn, args, kwargs)

    async def sleep(self, duration: float | timedelta) -> None:
        """Suspend the job for ``duration`` (seconds, or a timedelta), durably: this run
        ends (the attempt does not count; the worker's slot is freed) and the job runs
        again, on any worker, once the time has passed, its steps returning their
        results; when it reaches this sleep again, the sleep is over."""
        await self._run().sleep_until(None, sleep_seconds(duration))

    async def sleep_until(self, when: datetime) -> None:
        """`sleep` until ``when`` (an aware datetime)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError(f"sleep_until takes an aware datetime, not {when!r}")
        await self._run().sleep_until(when)

    async def wait_for_event(
        self,
        key: str,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, across runs
    ) -> Any:
        """The payload of the event ``key``: at once when it was emitted already (the
        first emit of a key wins and is kept), else the job waits (suspended, as by a
        sleep) until ``app.emit_event(key, ...)`` is called anywhere, and runs again. After
        ``timeout`` (counted from the first wait, in every run), `asyncq.EventTimeout`."""
        seconds = None if timeout is None else sleep_seconds(timeout)
        return await self._run().wait_for_event(key, seconds)

    async def spawn(self, task: Any, /, *args: Any, **kwargs: Any) -> int:
        """Defer a child job of this one (``task``, or ``task.options(queue=...,
        priority=..., max_attempts=...)``; it is ready at once, so other options are
        refused), durably: when the job runs again, the same call returns the same id and
        writes nothing. Returns the child's id, for `gather`."""
        return await self._run().spawn(task, args, kwargs)

    async def spawn_many(self, task: Any, kwargs_list: Sequence[dict[str, Any]], /) -> list[int]:
        """`spawn` of one child per dict of keyword arguments, in one statement."""
        return await self._run().spawn_many(task, list(kwargs_list))

    async def gather(self, ids: Sequence[int], *, return_exceptions: bool = False) -> list[Any]:
        """The results of the jobs ``ids``, in their order, once every one of them has
        ended: until then the job waits (suspended, its slot freed) and runs again when
        the last one ends. A job that failed or was cancelled raises `asyncq.ChildFailed`
        (with ``return_exceptions``, it stands in the list instead)."""
        return await self._run().gather(ids, return_exceptions=return_exceptions)


# What the running attempt's context is made of: its job, the worker's id, the stop
# event of a plain ``def`` task, and what its workflow calls write through. The
# JobContext itself is made by the first current_job() of the attempt: most tasks never
# ask, and a frozen dataclass costs about 2 µs to make, a tenth of what the worker
# spends on a short job.
_Parts = tuple[Job, str, threading.Event | None, Gateway | None]
# The attempt running in this context: set by the worker around each attempt, to its
# parts; `current_job` makes its JobContext from them on first use.
running_job: contextvars.ContextVar[JobContext | _Parts] = contextvars.ContextVar(
    "asyncq_current_job"
)


def current_job() -> JobContext:
    """The job whose task is running in this context.

    Raises `NotInJob` outside a task run by a worker.
    """
    try:
        found = running_job.get()
    except LookupError:
        raise NotInJob() from None
    if isinstance(found, JobContext):
        return found
    context = job_context(*found)
    running_job.set(context)
    return context


def job_context(
    job: Job,
    worker: str,
    stop_event: threading.Event | None = None,
    gateway: Gateway | None = None,
) -> JobContext:
    """The `JobContext` of an attempt of ``job`` run by ``worker``. The attempt of a
    plain ``def`` task (``stop_event`` set) runs in a thread, which cannot suspend its job:
    its workflow has no gateway (its progress has)."""
    scheduled_at = job.scheduled_at
    return JobContext(
        id=job.id,
        task_name=job.task_name,
        queue=job.queue,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        worker=worker,
        scheduled_at=None if scheduled_at is None else scheduled_at.astimezone(UTC),
        stop_event=stop_event,
        workflow=Run(job, gateway if stop_event is None else None),
        gateway=gateway,
    )


MAX_PROGRESS_MESSAGE = 500


def progress_json(done: object, message: object, attempt: int) -> str:
    """A report of `JobContext.progress` as the JSON the row keeps: ``fraction`` (a
    float from 0 to 1) or ``count`` (an int), ``message`` if any, the ``attempt`` and
    ``at`` (the worker's clock)."""
    report: dict[str, Any]
    if isinstance(done, bool) or not isinstance(done, int | float):
        raise TypeError(
            f"progress is a fraction (a float from 0.0 to 1.0) or a count (an int), not {done!r}"
        )
    if isinstance(done, int):
        if done < 0:
            raise ValueError(f"a count of progress is 0 or more, not {done}")
        report = {"count": done}
    else:
        if not (math.isfinite(done) and 0.0 <= done <= 1.0):
            raise ValueError(f"a fraction of progress is from 0.0 to 1.0, not {done}")
        report = {"fraction": done}
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(f"a progress message is a str, not {message!r}")
        if len(message) > MAX_PROGRESS_MESSAGE:
            message = message[: MAX_PROGRESS_MESSAGE - 3] + "..."
        message = message.replace("\x00", "\\x00")
        if not message.isascii():
            message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        report["message"] = message
    report["attempt"] = attempt
    report["at"] = datetime.now(UTC).isoformat(timespec="milliseconds")
    return codec.to_json(report)


def set_current_job(
    job: Job,
    worker: str,
    stop_event: threading.Event | None = None,
    gateway: Gateway | None = None,
) -> contextvars.Token[JobContext | _Parts]:
    return running_job.set((job, worker, stop_event, gateway))


def reset_current_job(token: contextvars.Token[JobContext | _Parts]) -> None:
    running_job.reset(token)
