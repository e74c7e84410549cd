"""Errors asyncq raises.

    AsyncqError
    ├── ConfigurationError        a bad option, name or DSN, found before any I/O
    │   └── InvalidName           a queue or task name asyncq refuses (also ValueError)
    ├── ArgumentsError            job arguments asyncq cannot store (also TypeError)
    │   └── PayloadTooLarge       serialised arguments over the configured cap
    ├── AppNotOpen                the App's pool is not open
    ├── DatabaseUnavailable       the database could not be reached
    ├── SchemaNotMigrated         the jobs table is missing or older than this asyncq
    ├── PreparedStatementsRefused the server lost or refused psycopg's prepared statements
    ├── TaskNotFound              a job names a task this worker does not know
    ├── TaskArgumentsMismatch     a job's stored arguments do not fit its function
    ├── UndecodableArguments      a job's stored arguments cannot be read back in Python
    ├── NotInJob                  current_job() outside a running job
    ├── JobNotFound               app.result() for an id no job has
    ├── JobFailed                 app.result() for a job that failed (.job_id, .last_error)
    ├── JobCancelled              app.result() for a job that was cancelled (.job_id)
    ├── ChildFailed               ctx.gather() of a job that failed or was cancelled
    ├── EventTimeout              ctx.wait_for_event() past its timeout (also TimeoutError)
    └── NotInWorkflow             a workflow call where a worker cannot checkpoint it

Each error's docstring is its default message.
"""

from __future__ import annotations


class AsyncqError(Exception):
    """An asyncq error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(AsyncqError):
    """asyncq is configured wrongly."""


class InvalidName(ConfigurationError, ValueError):
    """This queue or task name is not allowed."""


class ArgumentsError(AsyncqError, TypeError):
    """The job's arguments cannot be stored: they must be JSON-serialisable."""


class PayloadTooLarge(ArgumentsError):
    """The job's serialised arguments are larger than the configured cap."""


class AppNotOpen(AsyncqError):
    """The App is not open: use `async with app:` or `await app.open()` first."""


class DatabaseUnavailable(AsyncqError):
    """The database could not be reached."""


class SchemaNotMigrated(AsyncqError):
    """The asyncq schema is missing or out of date: run `asyncq migrate MODULE:APP`."""


class PreparedStatementsRefused(AsyncqError):
    """The server refused a prepared statement: behind PgBouncer in transaction mode, give
    the App prepare_threshold=None (the PgBouncer guide, docs/how-to/pgbouncer.md)."""


class TaskNotFound(AsyncqError):
    """The job names a task that this worker does not know."""


class TaskArgumentsMismatch(AsyncqError):
    """The job's stored arguments do not fit the task's function."""


class UndecodableArguments(AsyncqError):
    """The job's stored arguments cannot be decoded in Python."""


class NotInJob(AsyncqError):
    """current_job() was called outside a running asyncq job."""


class JobNotFound(AsyncqError):
    """No job has this id (it never existed, or was pruned)."""

    def __init__(self, message: str | None = None, *, job_id: int | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class _JobEnded(AsyncqError):
    """A job that `App.result` waited for ended without a result."""

    def __init__(
        self,
        message: str | None = None,
        *,
        job_id: int | None = None,
        last_error: str | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.last_error = last_error


class JobFailed(_JobEnded):
    """The job failed: its attempts are used up, or it was discarded."""


class JobCancelled(_JobEnded):
    """The job was cancelled."""


class ChildFailed(_JobEnded):
    """A job that ctx.gather() waited for failed or was cancelled (.job_id, .last_error)."""


class EventTimeout(AsyncqError, TimeoutError):
    """ctx.wait_for_event() waited past its timeout (.key)."""

    def __init__(self, message: str | None = None, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class NotInWorkflow(AsyncqError):
    """Steps, sleeps, waits and children need an ``async def`` task run by a worker (or
    by asyncq.testing)."""
