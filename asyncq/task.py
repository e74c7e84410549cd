"""Tasks: registered functions, and the jobs they write.

A `Task` knows its function, its options and a `JobWriter`; it turns a call into a
`NewJob` (its arguments encoded by `asyncq.codec`) and hands it to the writer. A
`SyncTask` is a plain ``def``, which workers run in a thread.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, overload

from asyncq import codec, connections
from asyncq.limits import NO_LIMITS, TaskLimits
from asyncq.retry import Backoff, seconds
from asyncq.store import NewJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, Connection

P = ParamSpec("P")
R = TypeVar("R")

MAX_INT = 2**31 - 1  # the int columns: priority, max_attempts
# A unique key is indexed, and a btree index entry holds at most ~2700 bytes (8 kB pages):
# a longer key would reach PostgreSQL and fail there, whatever the number of tries.
MAX_UNIQUE_KEY_BYTES = 1024


class JobWriter(Protocol):
    """Where a task's jobs are written (the App implements it)."""

    @property
    def max_args_bytes(self) -> int: ...

    def write(self, job: NewJob) -> Awaitable[int]:
        """One job on the App's pool, gathered with concurrent writes."""
        ...

    async def write_alone(
        self, job: NewJob, *, conn: AsyncConnection[Any] | None, unique_key: str | None
    ) -> int:
        """One job by its own statement: on ``conn`` (else the pool), with a unique key."""
        ...

    async def write_many(self, jobs: NewJob, *, conn: AsyncConnection[Any] | None) -> list[int]:
        """One job per element of ``jobs.args`` (a JSON array), in one statement."""
        ...

    async def write_after(
        self,
        jobs: NewJob,
        *,
        after: list[int],
        failure: str,
        conn: AsyncConnection[Any] | None,
    ) -> list[int]:
        """One job per element of ``jobs.args``, each to run once the jobs ``after`` end."""
        ...

    def write_sync(
        self, job: NewJob, *, conn: Connection[Any] | None, unique_key: str | None
    ) -> int:
        """One job from synchronous code: on ``conn`` (else the App's synchronous pool)."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class DeferOptions:
    conn: Any = None  # the caller's connection, resolved by `asyncq.connections`
    queue: str
    priority: int = 0
    delay: float = 0.0
    run_at: datetime | None = None
    unique_key: str | None = None
    max_attempts: int
    group: str | None = None
    after: tuple[int, ...] | None = None
    on_parent_failure: str = "cancel"


AFTER_FAILURE = ("cancel", "run")
MAX_AFTER = 10_000


def _after(after: object) -> tuple[int, ...] | None:
    if after is None:
        return None
    if isinstance(after, str | bytes) or not hasattr(after, "__iter__"):
        raise TypeError(f"after must be a list of job ids, not {after!r}")
    ids = tuple(after)
    if not ids:
        raise ValueError("after must name at least one job")
    if len(ids) > MAX_AFTER:
        raise ValueError(f"after may name at most {MAX_AFTER} jobs, not {len(ids)}")
    for job_id in ids:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise TypeError(f"after must be a list of job ids (ints from 1), not {job_id!r}")
    return ids


def _int(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_INT:
        raise ValueError(f"{name} must be an int from {minimum} to {MAX_INT}, not {value!r}")


def _check_options(options: DeferOptions) -> DeferOptions:
    codec.validate_name("queue", options.queue)
    _int(options.max_attempts, "max_attempts", 1)
    _int(options.priority, "priority", -MAX_INT - 1)
    if options.run_at is not None and (
        not isinstance(options.run_at, datetime) or options.run_at.tzinfo is None
    ):
        raise ValueError(
            f"run_at must be an aware datetime (with a tzinfo), not {options.run_at!r}"
        )
    key = options.unique_key
    if key is not None:
        if not isinstance(key, str) or "\x00" in key:
            raise ValueError(f"unique_key must be a string without NUL characters, not {key!r}")
        if not key.isascii() and not codec.is_text(key):
            raise ValueError(f"unique_key must not contain a lone surrogate: {key!r}")
        size = len(key.encode("utf-8"))
        if size > MAX_UNIQUE_KEY_BYTES:
            raise ValueError(
                f"unique_key must be at most {MAX_UNIQUE_KEY_BYTES} bytes of UTF-8, not"
                f" {size} (a longer key can be hashed, as hashlib.sha256(...).hexdigest())"
            )
    if options.on_parent_failure not in AFTER_FAILURE:
        raise ValueError(
            f"on_parent_failure must be 'cancel' or 'run', not {options.on_parent_failure!r}"
        )
    if options.after is not None:
        given = [
            name
            for name, value in (
                ("delay", options.delay),
                ("run_at", options.run_at),
                ("unique_key", options.unique_key),
                ("group", options.group),
            )
            if value
        ]
        if given:
            raise ValueError(
                f"after= cannot be combined with {', '.join(given)}: a job that runs after"
                " others is queued when they end"
            )
    group = options.group
    if group is not None:
        if not isinstance(group, str) or not group or "\x00" in group:
            raise ValueError(
                f"group must be a non-empty string without NUL characters, not {group!r}"
            )
        if not group.isascii() and not codec.is_text(group):
            raise ValueError(f"group must not contain a lone surrogate: {group!r}")
    return options


class Task(Generic[P, R]):
    """A registered task: ``await task.defer(...)`` queues a job, ``await task(...)`` runs it."""

    blocking = False
    """Whether workers run it in a thread (a plain ``def``: `SyncTask`)."""

    def __init__(
        self,
        writer: JobWriter,
        fn: Callable[P, Any],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        priority: int,
        retry: Backoff,
        retry_on: tuple[type[BaseException], ...] | None = None,
        timeout: float | None = None,
        limits: TaskLimits = NO_LIMITS,
    ) -> None:
        if inspect.iscoroutinefunction(fn) == self.blocking:
            kind = "a plain def" if self.blocking else "an async def"
            raise TypeError(f"{type(self).__name__} needs {kind} function, not {fn!r}")
        self.writer = writer
        self.fn = fn
        self.name = codec.validate_name("task", name)
        if not isinstance(retry, Backoff):
            raise TypeError(f"retry must be an asyncq.Backoff, not {retry!r}")
        self.retry = retry
        if retry_on is not None:
            retry_on = tuple(retry_on)
            if not all(isinstance(t, type) and issubclass(t, BaseException) for t in retry_on):
                raise TypeError(f"retry_on must be a tuple of exception types, not {retry_on!r}")
        self.retry_on = retry_on
        self.timeout = None if timeout is None else seconds(timeout, "timeout", minimum=1e-3)
        self.limits = limits
        self.defaults = _check_options(
            DeferOptions(queue=queue, max_attempts=max_attempts, priority=priority)
        )
        self._codec = codec.ArgsCodec(fn)
        self._deferrer: Deferrer[P] = Deferrer(self, self.defaults)

    @property
    def queue(self) -> str:
        """The queue its jobs go to unless `options` says otherwise."""
        return self.defaults.queue

    @property
    def max_attempts(self) -> int:
        """Attempts before a job of this task is ``failed``, unless `options` says otherwise."""
        return self.defaults.max_attempts

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        called: Awaitable[R] = self.fn(*args, **kwargs)
        return called

    async def defer(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Write one job and return its id."""
        # The task's own options name no connection and no unique key: the job goes
        # straight to the writer's gathered write.
        return await self.writer.write(self._deferrer.new_job(self.encode(args, kwargs)))

    async def defer_many(self, kwargs_list: Iterable[Mapping[str, Any]]) -> list[int]:
        """Write one job per dict of keyword arguments in one round trip; returns their ids."""
        return await self._deferrer.defer_many(kwargs_list)

    def defer_sync(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Write one job from synchronous code (a Django or Flask view, a script) and
        return its id: on the App's synchronous pool, opened on first use; with
        ``options(conn=...)``, on that connection, in its transaction."""
        return self._deferrer.defer_sync(*args, **kwargs)

    def options(
        self,
        *,
        conn: Any = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        unique_key: str | None = None,
        max_attempts: int | None = None,
        group: str | None = None,
        after: Iterable[int] | None = None,
        on_parent_failure: str = "cancel",
    ) -> Deferrer[P]:
        """The same task with other options for the jobs it writes.

        ``conn``: write the job on the caller's connection, in its transaction: a psycopg
        ``AsyncConnection`` for ``defer`` and ``defer_many``, a psycopg ``Connection`` for
        ``defer_sync``, or a SQLAlchemy session or connection with the psycopg driver
        (`asyncq.contrib.sqlalchemy`). ``group`` names the job's group (a customer, a
        tenant): with ``group_concurrency``, at most that many jobs of one group run at
        once.

        ``after``: the job waits (``waiting``, never claimed) until every job in it has
        ended; then it is queued if they all ended ``done`` (with ``on_parent_failure=
        "run"``, however they ended), else cancelled. A batch with a callback is a set of
        jobs and one job deferred ``after`` all of them with ``"run"``."""
        if delay is not None and run_at is not None:
            raise ValueError("give delay or run_at, not both")
        changes: dict[str, Any] = {
            "conn": conn,
            "delay": 0.0 if delay is None else seconds(delay, "delay"),
            "run_at": run_at,
            "unique_key": unique_key,
            "group": group,
            "after": _after(after),
            "on_parent_failure": on_parent_failure,
        }
        if priority is not None:
            changes["priority"] = priority
        if queue is not None:
            changes["queue"] = queue
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
        return Deferrer(self, _check_options(replace(self.defaults, **changes)))

    def encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The job's ``args`` column: arguments bound to parameter names, as JSON."""
        stored = self._codec.bind(self.name, args, kwargs)
        return codec.encode(self.name, stored, self.writer.max_args_bytes)

    def encode_many(self, kwargs_list: list[Mapping[str, Any]]) -> str:
        """The ``args`` of one job per dict of keyword arguments, as one JSON array."""
        stored = self._codec.bind_many(self.name, kwargs_list)
        return codec.encode_many(self.name, stored, self.writer.max_args_bytes)

    def call_stored(self, stored_args: Any) -> Coroutine[Any, Any, Any]:
        """The coroutine for stored arguments; `TaskArgumentsMismatch` if they do not fit."""
        return self._codec.call(self.fn, stored_args)

    def prepare_stored(self, stored_args: Any) -> Callable[[], Any]:
        """The call of the function with stored arguments, bound but not made;
        `TaskArgumentsMismatch` if they do not fit."""
        positional, keywords = self._codec.arguments(self.fn, stored_args)
        return functools.partial(self.fn, *positional, **keywords)


class SyncTask(Task[P, R]):
    """A task that is a plain ``def``: workers run it in their thread pool (the worker's
    ``threads`` option), and ``task(...)`` calls it directly."""

    blocking = True

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:  # type: ignore[override]
        result: R = self.fn(*args, **kwargs)
        return result


class Deferrer(Generic[P]):
    """A task with fixed options; from `Task.options`."""

    def __init__(self, task: Task[P, Any], options: DeferOptions) -> None:
        self.task = task
        self.opts = options

    async def defer(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Write one job and return its id (or the live job's id for a taken unique_key)."""
        o = self.opts
        if o.after is not None:
            encoded = "[" + self.task.encode(args, kwargs) + "]"
            [job_id] = await self._write_after(self.new_job(encoded))
            return job_id
        job = self.new_job(self.task.encode(args, kwargs))
        if o.conn is None and o.unique_key is None and o.group is None:
            return await self.task.writer.write(job)
        conn = None if o.conn is None else await connections.async_connection(o.conn)
        return await self.task.writer.write_alone(job, conn=conn, unique_key=o.unique_key)

    async def _write_after(self, jobs: NewJob) -> list[int]:
        o = self.opts
        assert o.after is not None
        conn = None if o.conn is None else await connections.async_connection(o.conn)
        return await self.task.writer.write_after(
            jobs, after=list(o.after), failure=o.on_parent_failure, conn=conn
        )

    def defer_sync(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """`defer` from synchronous code: on the App's synchronous pool, or on
        ``conn`` (a psycopg ``Connection``, a SQLAlchemy ``Session``), in its transaction."""
        job = self.new_job(self.task.encode(args, kwargs))
        o = self.opts
        if o.after is not None:
            raise ValueError("after= needs defer or defer_many (async), not defer_sync")
        conn = None if o.conn is None else connections.sync_connection(o.conn)
        return self.task.writer.write_sync(job, conn=conn, unique_key=o.unique_key)

    async def defer_many(self, kwargs_list: Iterable[Mapping[str, Any]]) -> list[int]:
        """Write one job per dict of keyword arguments in one round trip; returns their ids."""
        if self.opts.unique_key is not None:
            raise ValueError("defer_many cannot take a unique_key")
        calls = list(kwargs_list)
        if not calls:
            return []
        jobs = self.new_job(self.task.encode_many(calls))
        if self.opts.after is not None:
            return await self._write_after(jobs)
        conn = (
            None if self.opts.conn is None else await connections.async_connection(self.opts.conn)
        )
        return await self.task.writer.write_many(jobs, conn=conn)

    def new_job(self, args: str) -> NewJob:
        """The row to write for encoded ``args``, with these options."""
        o = self.opts
        return NewJob(
            self.task.name, o.queue, args, o.priority, o.run_at, o.delay, o.max_attempts, o.group
        )


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` with options returns: it registers the function below it."""

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def __call__(self, fn: Callable[P, R], /) -> SyncTask[P, R]: ...
