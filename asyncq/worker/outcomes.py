"""What happens to a job after an attempt: a pure decision, tested as a table.

`decide` takes how the attempt ended (returned, raised, or was stopped by the worker)
and the task's policy, and returns the `Outcome` to write, or None when there is
nothing this worker may write (it lost the lease). What a task returned is encoded here,
in the runner that ran it, as JSON text to store (`codec.encode_result`); a result that
cannot be stored leaves the job done, without it.
"""

from __future__ import annotations

import enum
import os
import traceback
from typing import Any, NamedTuple, Protocol

from asyncq.codec import encode_result
from asyncq.control import Discard, Retry, Snooze
from asyncq.errors import ArgumentsError, TaskNotFound, UndecodableArguments
from asyncq.job import Job
from asyncq.retry import Backoff
from asyncq.workflow import LeaseLost, Suspended

MAX_ERROR_CHARS = 8000
# How long a job whose task this worker does not know waits before a worker claims it
# again (this one claims no more of that task's jobs): long enough that workers that do
# not know it either do not pass it round and round.
UNKNOWN_TASK_DELAY = 1.0
MAX_TRACEBACK_FRAMES = 12
DEFAULT_BACKOFF = Backoff()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Kind(enum.Enum):
    DONE = "done"  # returned: the row is done
    RETRY = "retry"  # failed, attempts left: queued again after ``delay``
    FAIL = "fail"  # failed for good
    SNOOZE = "snooze"  # queued again after ``delay``; the attempt does not count
    RELEASE = "release"  # handed back at shutdown
    CANCEL = "cancel"  # stopped by a cancel: the row is cancelled, never retried
    SUSPEND = "suspend"  # the task suspended its job (a sleep, a wait): written already
    GIVE_BACK = "give back"  # a task this worker does not know: queued again, not counted

    # Members are singletons compared by identity: hashed by it too, in C (Enum's own
    # __hash__ is Python code, and every outcome is counted and grouped by its kind).
    __hash__ = object.__hash__


# Kind.DONE, for the paths taken by every job: Python 3.11's Enum classes find their
# members through a __getattr__ of their metaclass, ten times slower than a global name.
DONE = Kind.DONE


class Outcome(NamedTuple):
    job: Job
    kind: Kind
    error: str | None = None  # the row's last_error (RETRY, FAIL)
    delay: float = 0.0  # seconds until the job may run again (RETRY, SNOOZE)
    result: str | None = None  # DONE: what the task returned, as JSON text; None stores none
    unstored: str | None = None  # DONE: why what the task returned is not stored
    duration: float = 0.0  # seconds the attempt ran
    logs: str | None = None  # what the task logged in the attempt, as JSON (log_capture)
    progress: str | None = None  # the progress it reported last, as JSON, if not yet written


class Stop(enum.Enum):
    """Why the worker itself cancelled an attempt."""

    LEASE_LOST = "lease lost"  # another claim owns the row now: write nothing
    TIMEOUT = "timeout"  # the task's timeout ran out: a failed attempt
    SHUTDOWN = "shutdown"  # the grace period is over: hand the job back
    ABORT = "abort"  # a cancel asked for it (app.cancel, from any process)


class Policy(Protocol):
    """What `decide` needs of a task."""

    @property
    def retry(self) -> Backoff: ...

    @property
    def retry_on(self) -> tuple[type[BaseException], ...] | None: ...

    @property
    def timeout(self) -> float | None: ...


def decide(
    job: Job,
    policy: Policy | None,
    *,
    result: Any = None,
    error: BaseException | None = None,
    stop: Stop | None = None,
    duration: float = 0.0,
) -> Outcome | None:
    """The outcome of an attempt of ``job`` (``policy`` None: its task is unknown here).

    ``error`` is what the attempt raised, None if it returned ``result``; ``stop`` says
    why the worker cancelled it, if it did; ``duration`` how long it ran. An attempt the
    worker stopped but that returned anyway is done, unless its lease is gone.
    """
    if stop is Stop.LEASE_LOST or isinstance(error, LeaseLost):
        return None
    if error is None:
        if result is None:
            return Outcome(job, Kind.DONE, duration=duration)
        try:
            stored = encode_result(job.task_name, result)
        except ArgumentsError as exc:  # the job is done all the same
            return Outcome(job, Kind.DONE, unstored=str(exc), duration=duration)
        except Exception as exc:  # noqa: BLE001 - raised by the result's own code
            text = f"encoding the result of {job.task_name} raised {type(exc).__name__}: {exc}"
            return Outcome(job, Kind.DONE, unstored=text, duration=duration)
        return Outcome(job, Kind.DONE, result=stored, duration=duration)
    if isinstance(error, Suspended) and stop is None:
        return Outcome(job, Kind.SUSPEND, duration=duration)
    if isinstance(error, TaskNotFound) and stop is None:
        # Another worker may know it (a rolling deploy that adds it, another App on the
        # same table): the attempt does not count.
        return Outcome(job, Kind.GIVE_BACK, error=describe_error(error), delay=UNKNOWN_TASK_DELAY)
    if stop is Stop.ABORT:
        return Outcome(job, Kind.CANCEL, duration=duration)
    if stop is Stop.SHUTDOWN:
        return Outcome(job, Kind.RELEASE, duration=duration)
    if stop is Stop.TIMEOUT:
        assert policy is not None and policy.timeout is not None
        text = (
            f"TimeoutError: attempt {job.attempt} of {job.max_attempts} timed out after"
            f" {policy.timeout:g}s and was cancelled"
        )
        return _failed(job, policy, text, duration=duration)
    if isinstance(error, Discard):
        return Outcome(job, Kind.FAIL, error=f"Discard: {error.reason}", duration=duration)
    if isinstance(error, Snooze):
        return Outcome(job, Kind.SNOOZE, delay=error.after, duration=duration)
    if isinstance(error, Retry):
        return _failed(job, policy, f"Retry: {error}", after=error.after, duration=duration)
    text = describe_error(error)
    if isinstance(error, UndecodableArguments):
        return Outcome(
            job, Kind.FAIL, error=text, duration=duration
        )  # the same bytes fail the same way again
    if (
        policy is not None
        and policy.retry_on is not None
        and not isinstance(error, policy.retry_on)
    ):
        return Outcome(job, Kind.FAIL, error=text, duration=duration)
    return _failed(job, policy, text, duration=duration)


def _failed(
    job: Job, policy: Policy | None, text: str, after: float | None = None, duration: float = 0.0
) -> Outcome:
    if job.attempt >= job.max_attempts:
        return Outcome(job, Kind.FAIL, error=text, duration=duration)
    if after is None:
        after = (policy.retry if policy is not None else DEFAULT_BACKOFF).delay(job.attempt)
    return Outcome(job, Kind.RETRY, error=text, delay=after, duration=duration)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` and a trimmed traceback, without frame locals."""
    head = "".join(traceback.format_exception_only(exc)).strip()
    # asyncq's own frames (the runner, a step's call) say nothing about the job.
    summary = traceback.extract_tb(exc.__traceback__)
    own = traceback.StackSummary.from_list(
        [f for f in summary if not f.filename.startswith(_PACKAGE_DIR)] or summary
    )
    frames = own.format()[-MAX_TRACEBACK_FRAMES:]
    text = head + ("\n\nTraceback (most recent call last):\n" + "".join(frames) if frames else "")
    # PostgreSQL text holds neither NUL nor unpaired surrogates: escape them, or the
    # outcome could never be written.
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 15] + "\n... (trimmed)"
    return text
