"""What a task raises to steer its own job. These are not errors asyncq raises (those are
in `asyncq.errors`): a worker turns each into the job's next state.

    JobControl
    ├── Retry(after=None)    this attempt failed: retry after ``after`` seconds, else
    │                        after the task's backoff (the attempt counts)
    ├── Snooze(after)        run again after ``after`` seconds (the attempt does not count)
    └── Discard(reason)      fail the job now, whatever attempts are left
"""

from __future__ import annotations

from datetime import timedelta

from asyncq.retry import seconds


class JobControl(Exception):
    """Raised by a task to decide what happens to its job next."""


class Retry(JobControl):
    """This attempt failed: retry after ``after`` seconds (else the task's backoff).

    The attempt counts: once they are used up, the job fails.
    """

    def __init__(self, after: float | timedelta | None = None, reason: str = "") -> None:
        self.after = None if after is None else seconds(after, "Retry(after=...)")
        self.reason = reason
        super().__init__(reason or "retry requested by the task")


class Snooze(JobControl):
    """Run the job again after ``after`` seconds; this attempt does not count."""

    def __init__(self, after: float | timedelta) -> None:
        self.after = seconds(after, "Snooze(after)")
        super().__init__(f"snoozed for {self.after:g}s")


class Discard(JobControl):
    """Fail the job now, with ``reason`` as its ``last_error``; no more attempts."""

    def __init__(self, reason: str = "discarded by the task") -> None:
        self.reason = reason
        super().__init__(reason)
