"""Run one job: a pure decision about its outcome, and a thin runner around the task."""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping
from typing import Any, NamedTuple

import anyio

from asyncq.errors import TaskNotFound
from asyncq.job import Job, JobContext, reset_current_job, set_current_job
from asyncq.retry import Backoff
from asyncq.task import Task

MAX_ERROR_CHARS = 8000
MAX_TRACEBACK_FRAMES = 12
DEFAULT_BACKOFF = Backoff()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Outcome(NamedTuple):
    """What happened to one attempt. ``error`` is None on success."""

    job: Job
    error: str | None = None
    retry_in: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.error is None


def describe_error(exc: BaseException) -> str:
    """``Type: message`` and a trimmed traceback, without frame locals."""
    head = "".join(traceback.format_exception_only(exc)).strip()
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        tb = tb.tb_next  # asyncq's own frames say nothing about the job
    frames = traceback.format_tb(tb or exc.__traceback__, limit=-MAX_TRACEBACK_FRAMES)
    text = head + ("\n\nTraceback (most recent call last):\n" + "".join(frames) if frames else "")
    # PostgreSQL text holds neither NUL nor unpaired surrogates: escape them, or the
    # outcome could never be written.
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 15] + "\n... (trimmed)"
    return text


def classify(job: Job, backoff: Backoff, exc: BaseException | None) -> Outcome:
    """The outcome of an attempt that ended with ``exc`` (None: it returned)."""
    if exc is None:
        return Outcome(job)
    return Outcome(job, error=describe_error(exc), retry_in=backoff.delay(job.attempt))


async def execute(job: Job, tasks: Mapping[str, Task[Any, Any]], worker: str) -> Outcome:
    """Run ``job``'s task to an outcome. Cancellation propagates; every other exception,
    SystemExit and KeyboardInterrupt included, becomes the job's error."""
    task = tasks.get(job.task_name)
    token = set_current_job(
        JobContext(
            id=job.id,
            task_name=job.task_name,
            queue=job.queue,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            worker=worker,
        )
    )
    try:
        if task is None:
            raise TaskNotFound(
                f"unknown task {job.task_name!r}: no task of that name is registered"
                " on this worker's App"
            )
        await task.call_stored(job.args)
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException as exc:  # noqa: BLE001 - a job's failure must never stop the worker
        return classify(job, task.retry if task else DEFAULT_BACKOFF, exc)
    finally:
        reset_current_job(token)
    return classify(job, task.retry, None)
