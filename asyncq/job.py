"""Jobs and their states.

A job moves through these states; every arrow out of ``running`` is written
only by the worker that still holds the job's lease for that attempt, or by
the reaper once that lease has expired::

                 claim                 success
    queued ─────────────▶ running ─────────────▶ done
      ▲                    │  │
      │  retry (backoff),  │  │ error, attempts used up
      │  lease expired,    │  ▼
      └──── released ──────┘ failed ──▶ (a person requeues it, or not)

``cancelled`` is reserved for jobs a person cancels before they run.
"""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass
from typing import Any, NamedTuple

from asyncq.errors import NotInJob


class Status(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Job(NamedTuple):
    """A claimed job, as the worker runs it (a tuple: made for every job, it costs a
    third of a frozen dataclass)."""

    id: int
    task_name: str
    queue: str
    args: Any
    attempt: int
    max_attempts: int


@dataclass(frozen=True, kw_only=True, slots=True)
class JobContext:
    """What a running task can know about its own job (see `current_job`)."""

    id: int
    task_name: str
    queue: str
    attempt: int
    max_attempts: int
    worker: str


_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("asyncq_current_job")


def current_job() -> JobContext:
    """The job whose task is running in this context.

    Raises `NotInJob` outside a task run by a worker.
    """
    try:
        return _current.get()
    except LookupError:
        raise NotInJob() from None


def set_current_job(context: JobContext) -> contextvars.Token[JobContext]:
    return _current.set(context)


def reset_current_job(token: contextvars.Token[JobContext]) -> None:
    _current.reset(token)


@dataclass(frozen=True, kw_only=True, slots=True)
class RequeueResult:
    """What `App.requeue` did: the ids put back in the queue, and why others were not."""

    requeued: list[int]
    refused: dict[int, str]


def refusal(status: str | None) -> str:
    """Why a job in ``status`` (None: no such job) cannot be requeued."""
    if status is None:
        return "no such job"
    if status in (Status.FAILED, Status.CANCELLED):
        return f"{status}, but a live job holds its unique key"
    if status == Status.QUEUED:
        return "already queued"
    return f"{status}: only failed or cancelled jobs can be requeued"
