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

``cancelled``: a cancel ends a queued job there at once; for a running one it marks
the row, and whatever ends that attempt (its worker stopping it, a failure, a
hand-back, the reaper) ends the job ``cancelled``, not queued again.

A schedule's slot makes a job like any other, with ``schedule`` and ``scheduled_at`` set.

Every claim of a row adds one to its ``claims``, which nothing resets: the claim a
worker holds a job by is the fence of all its writes for that attempt.
"""

from __future__ import annotations

import contextvars
import enum
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from asyncq.errors import NotInJob


class Status(enum.StrEnum):
    """A job's state, the ``status`` column of ``asyncq_jobs``: ``queued``, ``running``,
    ``done``, ``failed`` or ``cancelled``."""

    QUEUED = "queued"
    RUNNING = "running"
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

    @property
    def stop_requested(self) -> bool:
        """True once the worker has stopped this attempt of a plain ``def`` task (its
        timeout, a cancel, a lost lease, a shutdown's grace over): the attempt's outcome
        is already written, and a thread cannot be stopped from outside, so a function
        that runs long looks at this between steps and returns. Always False in an
        ``async def`` task, which is cancelled instead."""
        return self.stop_event is not None and self.stop_event.is_set()


# What the running attempt's context is made of: its job, the worker's id and the stop
# event of a plain ``def`` task. The JobContext itself is made by the first current_job()
# of the attempt: most tasks never ask, and a frozen dataclass costs about 2 µs to make,
# a tenth of what the worker spends on a short job.
_Parts = tuple[Job, str, threading.Event | None]
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


def job_context(job: Job, worker: str, stop_event: threading.Event | None = None) -> JobContext:
    """The `JobContext` of an attempt of ``job`` run by ``worker``."""
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
    )


def set_current_job(
    job: Job, worker: str, stop_event: threading.Event | None = None
) -> contextvars.Token[JobContext | _Parts]:
    return running_job.set((job, worker, stop_event))


def reset_current_job(token: contextvars.Token[JobContext | _Parts]) -> None:
    running_job.reset(token)
