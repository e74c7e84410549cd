"""App: the task registry, the connection pool, migrations and the worker entry point."""

from __future__ import annotations

import inspect
import logging
import os
import re
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from asyncq import admin, codec, connections, embedded, migrate, pools, workflow
from asyncq.admin import RequeueResult, ScheduleInfo, WorkerState
from asyncq.errors import AppNotOpen, ConfigurationError, DatabaseUnavailable
from asyncq.limits import ClaimLimits, TaskLimits
from asyncq.pools import reconnect_options, tcp_defaults
from asyncq.results import Results
from asyncq.retry import Backoff
from asyncq.schedule import Cron, Schedule
from asyncq.store import Store
from asyncq.task import SyncTask, Task, TaskDecorator
from asyncq.worker import settings as worker_settings
from asyncq.worker.executor import Middleware
from asyncq.worker.observer import Observer, WorkerStats
from asyncq.worker.supervisor import Worker
from asyncq.writer import Writer

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from asyncq.worker.settings import WorkerOptions

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_MAX_ARGS_BYTES = 1024 * 1024
DEFAULT_POOL_MAX_SIZE = 10
# psycopg's own default: a statement is prepared on its sixth execution on a connection.
DEFAULT_PREPARE_THRESHOLD = 5
# Connections a worker's tasks may take from the App's pool beyond one each: the
# gathered defers' writer, and one more.
POOL_HEADROOM = 2
# Short enough that the wake-up channel "asyncq.<schema>" fits PostgreSQL's 63 bytes;
# PostgreSQL reserves names starting with pg_.
_SCHEMA_NAME = re.compile(r"(?!pg_)[a-z_][a-z0-9_]{0,49}")


def describe_dsn(dsn: str) -> str:
    """The DSN as it may be logged: host, port, database and user; never a password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    host = str(parts.get("host") or "localhost")
    port = parts.get("port") or "5432"
    where = host if host.startswith("/") else f"{host}:{port}"
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"postgresql://{user}{where}/{parts.get('dbname', '')}"


def _check_schema(schema: str | None) -> None:
    if schema is not None and not (isinstance(schema, str) and _SCHEMA_NAME.fullmatch(schema)):
        raise ConfigurationError(
            f"schema must be a lowercase SQL name of at most 50 characters"
            f" (letters, digits, _), not starting with pg_, not {schema!r}"
        )


class App:
    """An asyncq application: register tasks on it, open it, defer jobs, run workers.

    DSN resolution: the ``dsn`` argument, then ``$ASYNCQ_DSN``, then the embedded
    PostgreSQL (``asyncq[embedded]``), in a database of the App's project, made on
    first use: ``embedded_database``, else ``$ASYNCQ_EMBEDDED_DATABASE``, else
    ``asyncq_<project directory>`` (see `asyncq.embedded`; the project is found from
    the file of the module that makes the App). Nothing connects until `open`.

    The pool (``pool_max_size``, 10 by default) serves defers and whatever tasks do with
    ``app.pool``; a worker's own work (claims, outcomes, leases) has a pool of its own.
    Left at its default, the pool grows to the concurrency of a worker run on the App,
    plus two, so that tasks that each hold a connection can still defer.

    ``tracing=True`` (extra ``asyncq[otel]``): OpenTelemetry spans for each defer and
    each attempt of the App's workers, the attempt's span linked to the defer's (see
    `asyncq.tracing`); each job row carries its defer's trace context.

    Behind PgBouncer in transaction mode (docs/how-to/pgbouncer.md): ``listen_dsn``
    sends the LISTEN connections (a worker's wake-ups, `result`'s notifications)
    straight to the server while everything else uses ``dsn``; ``listen=False`` opens
    none, and workers and `result` poll instead; ``prepare_threshold`` is psycopg's,
    for every connection the App opens (None: no prepared statements, as a PgBouncer
    without ``max_prepared_statements`` needs).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool_min_size: int = 1,
        pool_max_size: int | None = None,
        connect_timeout: float = 10.0,
        max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
        retention: timedelta = timedelta(days=7),
        schema: str | None = None,
        application_name: str = "asyncq",
        result_poll_interval: float = 1.0,
        tracing: bool = False,
        listen_dsn: str | None = None,
        listen: bool = True,
        prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
        embedded_database: str | None = None,
    ) -> None:
        max_size = (
            max(DEFAULT_POOL_MAX_SIZE, pool_min_size) if pool_max_size is None else pool_max_size
        )
        if pool_min_size < 0 or max_size < max(pool_min_size, 1):
            raise ConfigurationError("need 0 <= pool_min_size <= pool_max_size, pool_max_size >= 1")
        if max_args_bytes < 2:
            raise ConfigurationError("max_args_bytes must be at least 2")
        if retention < timedelta(0):
            raise ConfigurationError("retention must not be negative")
        if not result_poll_interval > 0:
            raise ConfigurationError("result_poll_interval must be a positive number of seconds")
        if not isinstance(tracing, bool):
            raise ConfigurationError(f"tracing must be True or False, not {tracing!r}")
        if not isinstance(listen, bool):
            raise ConfigurationError(f"listen must be True or False, not {listen!r}")
        if listen_dsn is not None and not listen:
            raise ConfigurationError("listen_dsn has no use with listen=False: give one, not both")
        if listen_dsn is not None and not (isinstance(listen_dsn, str) and listen_dsn.strip()):
            raise ConfigurationError(f"listen_dsn must be a DSN, not {listen_dsn!r}")
        if prepare_threshold is not None and (
            isinstance(prepare_threshold, bool)
            or not isinstance(prepare_threshold, int)
            or prepare_threshold < 0
        ):
            raise ConfigurationError(
                f"prepare_threshold must be None or a whole number >= 0, not {prepare_threshold!r}"
            )
        _check_schema(schema)
        if embedded_database is not None:
            embedded.check_database_name(embedded_database)
        self.embedded_database = embedded_database
        # Where the App's project is (its database on the embedded server): found from
        # this module's file when the embedded server is used.
        self._origin = embedded.creating_module_file()
        self._dsn_argument = dsn
        self._listen_dsn_argument = listen_dsn
        self.listen = listen
        self.prepare_threshold = prepare_threshold
        self.pool_min_size = pool_min_size
        self.pool_max_size = max_size
        self._pool_size_given = pool_max_size is not None
        self.connect_timeout = connect_timeout
        self.max_args_bytes = max_args_bytes
        self.retention = retention
        self.application_name = application_name
        self.schema = schema
        self.store = Store(schema, traced=tracing)
        self.tracing = tracing
        self.writer: Writer
        self._observers: list[Observer] = []  # listeners of every worker run on the App
        if tracing:
            from asyncq import tracing as otel

            tracer = otel.tracer()
            self.writer = otel.TracedWriter(
                self.store, max_args_bytes=max_args_bytes, tracer=tracer
            )
            self._observers.append(otel.AttemptTracer(tracer))
        else:
            self.writer = Writer(self.store, max_args_bytes=max_args_bytes)
        self.results = Results(
            store=self.store,
            pool=lambda: self.pool,
            connect=lambda: psycopg.AsyncConnection.connect(
                self.listen_dsn,
                **pools.for_dsn(self.connect_kwargs(role="results"), self.listen_dsn),
            ),
            poll_interval=result_poll_interval,
            listen=listen,
        )
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.schedules: dict[str, Schedule] = {}
        # Where the asyncq command found this App (MODULE:APP): its workers say so in
        # asyncq_workers.
        self.import_path: str | None = None
        self._middleware: list[Middleware] = []
        self._dsn: str | None = None
        self._tcp = tcp_defaults("")  # less what the DSN sets, once it is resolved
        self._pool: AsyncConnectionPool | None = None
        self._sync_pool: ConnectionPool | None = None
        self._sync_lock = threading.Lock()
        self.writer.sync_pool = self._opened_sync_pool

    # -- tasks ------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def task(self, fn: Callable[P, R], /) -> SyncTask[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        name: str | None = None,
        priority: int = 0,
        retry: Backoff | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        group_concurrency: int | None = None,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        name: str | None = None,
        priority: int = 0,
        retry: Backoff | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        group_concurrency: int | None = None,
    ) -> Any:
        """Register a function as a task. The name defaults to ``module.qualname``.

        An ``async def`` runs on the worker's event loop; a plain ``def`` becomes a
        `SyncTask`, run in the worker's thread pool (its ``threads`` option). A thread
        cannot be stopped from outside: when a ``def`` task's attempt is stopped (its
        timeout, a cancel, a shutdown's grace over), its outcome is written at once and
        the function runs on to its own end, its result dropped; it can look at
        ``current_job().stop_requested`` to return early.

        ``retry``: the backoff between attempts; ``retry_on``: only these exceptions are
        retried, any other fails the job at once; ``timeout``: seconds an attempt may run
        before it is cancelled and counted as a failure.

        Limits, across every worker of the App: ``concurrency``, at most that many of the
        task's jobs run at once; ``rate_limit`` (``"N/s"``, ``"N/m"`` or ``"N/h"``), at
        most N of them start in any second, minute or hour; ``group_concurrency``, at
        most that many jobs of one group (``task.options(group=...)``) run at once.
        They are enforced when workers claim, from the limits the workers' own App
        declares. A bad limit raises `ConfigurationError` here."""
        limits = TaskLimits.declared(
            concurrency=concurrency, rate_limit=rate_limit, group_concurrency=group_concurrency
        )

        def register(function: Callable[..., Any]) -> Task[Any, Any]:
            task_name = f"{function.__module__}.{function.__qualname__}" if name is None else name
            if task_name in self.tasks:
                raise ConfigurationError(f"a task named {task_name!r} is already registered")
            if inspect.isasyncgenfunction(function) or not callable(function):
                raise TypeError(f"@app.task needs a def or an async def, not {function!r}")
            kind = Task if inspect.iscoroutinefunction(function) else SyncTask
            task: Task[Any, Any] = kind(
                self.writer,
                function,
                name=task_name,
                queue=queue,
                max_attempts=max_attempts,
                priority=priority,
                retry=retry or Backoff(),
                retry_on=retry_on,
                timeout=timeout,
                limits=limits,
            )
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def periodic(
        self,
        cron: str,
        *,
        name: str | None = None,
        queue: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        tz: str = "UTC",
    ) -> TaskDecorator:
        """Register a function as a task (as `task` does, in ``queue``) and schedule
        it: every slot of ``cron`` in ``tz`` makes one job with ``kwargs``. ``name`` names
        the task and its schedule (default: the task name)."""
        Cron(cron, tz)  # a bad expression is refused before the task is registered

        def register(function: Callable[..., Any]) -> Any:
            task: Task[Any, Any] = self.task(name=name, queue=queue or "default")(function)
            try:
                self.schedule(task, cron=cron, kwargs=kwargs, tz=tz)
            except BaseException:
                del self.tasks[task.name]
                raise
            return task

        return register

    def schedule(
        self,
        task: Task[Any, Any],
        *,
        cron: str,
        name: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        tz: str = "UTC",
    ) -> Schedule:
        """Schedule a task of this App: every slot of ``cron`` (five fields, or ``@hourly``,
        ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``) in the time zone ``tz`` makes
        one job with ``kwargs``, however many workers run. The schedule's ``name`` (its
        identity in the database) defaults to the task's name: a task's second schedule
        needs a name of its own.

        Raises `ValueError` for a bad expression, time zone or name (a duplicate too),
        `TypeError` for ``kwargs`` that are not JSON or do not fit the function."""
        if not isinstance(task, Task) or self.tasks.get(task.name) is not task:
            raise ValueError(f"{task!r} is not a task registered on this App")
        parsed = Cron(cron, tz)
        schedule_name = codec.validate_name("schedule", task.name if name is None else name)
        if schedule_name in self.schedules:
            hint = " (give this schedule a name=)" if name is None else ""
            raise ValueError(f"a schedule named {schedule_name!r} is already declared{hint}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping of keyword arguments, not {kwargs!r}")
        schedule = Schedule(
            name=schedule_name,
            cron=parsed,
            task_name=task.name,
            queue=task.queue,
            args=task.encode((), dict(kwargs or {})),
            priority=task.defaults.priority,
            max_attempts=task.max_attempts,
        )
        self.schedules[schedule_name] = schedule
        return schedule

    def middleware(self, fn: Middleware) -> Middleware:
        """Register ``async def fn(job, call_next)`` to run around every attempt of this
        App's workers, in the order registered (the first is outermost). It must await
        ``call_next()`` once and return its result; ``job`` is the `JobContext`."""
        self._middleware.append(fn)
        return fn

    # -- connections ------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """The resolved DSN (after `open`). Holds any password: do not log it."""
        if self._dsn is None:
            raise AppNotOpen()
        return self._dsn

    def rebind(self, *, dsn: str | None, schema: str | None) -> None:
        """Point this App, while it is closed, at another database and schema: its tasks'
        defers, its workers, `result` and the admin calls follow. `asyncq.testing` binds a
        user's App to a test's schema with it (and back afterwards)."""
        if self._pool is not None:
            raise ConfigurationError("an open App cannot be rebound: close it first")
        _check_schema(schema)
        self.close_sync()
        self._dsn_argument = dsn
        self.schema = schema
        self.store = Store(schema, traced=self.tracing)
        self.writer.store = self.store
        self.results.store = self.store

    @property
    def listen_dsn(self) -> str:
        """Where the LISTEN connections go (after `open`): ``listen_dsn``, else the DSN."""
        return self._listen_dsn_argument or self.dsn

    @property
    def dsn_argument(self) -> str | None:
        """The DSN the App was given (or `rebind` gave it): None resolves it on `open`."""
        return self._dsn_argument

    @property
    def is_open(self) -> bool:
        """Whether `open` has run (and `close` not yet): the App has its pool."""
        return self._pool is not None

    @property
    def middlewares(self) -> tuple[Middleware, ...]:
        """The middleware registered with `middleware`, outermost first."""
        return tuple(self._middleware)

    @property
    def pool(self) -> AsyncConnectionPool:
        """The App's psycopg connection pool (after `open`; `AppNotOpen` before). Its
        connections are in autocommit mode: open a transaction with ``conn.transaction()``."""
        if self._pool is None:
            raise AppNotOpen()
        return self._pool

    def connect_kwargs(self, *, role: str | None = None) -> dict[str, Any]:
        """Options of every connection the App opens; ``role`` is added to its
        application_name (``<name>:<pid>:<role>``). TCP keepalives and a TCP user timeout
        (`asyncq.pools.TCP_DEFAULTS`) unless the DSN sets them."""
        name = f"{self.application_name}:{os.getpid()}"
        return {
            "autocommit": True,
            "application_name": f"{name}:{role}" if role else name,
            # Text travels as UTF-8 whatever the server's encoding: the server converts
            # (and says so when it cannot), and SQL_ASCII text is still decoded as str.
            "client_encoding": "UTF8",
            "prepare_threshold": self.prepare_threshold,
            "connect_timeout": max(1, round(self.connect_timeout)),
            **self._tcp,
        }

    def _resolve_dsn_sync(self) -> str:
        if self._dsn_argument:
            logger.info("using PostgreSQL at %s", describe_dsn(self._dsn_argument))
            return self._dsn_argument
        from_env = os.environ.get("ASYNCQ_DSN")
        if from_env:
            logger.info("using PostgreSQL at %s (from ASYNCQ_DSN)", describe_dsn(from_env))
            return from_env
        return embedded.start_for(self._origin, self.embedded_database)

    async def _resolve_dsn(self) -> str:
        return await anyio.to_thread.run_sync(self._resolve_dsn_sync)

    def _opened_sync_pool(self) -> ConnectionPool:
        """The synchronous pool that ``defer_sync`` writes on, opened on its first use."""
        pool = self._sync_pool
        if pool is not None:
            return pool
        with self._sync_lock:
            if self._sync_pool is None:
                dsn = self._dsn or self._resolve_dsn_sync()
                self._tcp = tcp_defaults(dsn)
                pool = ConnectionPool(
                    dsn,
                    min_size=0,
                    max_size=self.pool_max_size,
                    kwargs=self.connect_kwargs(role="sync"),
                    timeout=self.connect_timeout,
                    # Checked out after idling in a web process for hours: a connection that
                    # died meanwhile is replaced before the job is written on it.
                    check=ConnectionPool.check_connection,
                    open=False,
                    name="asyncq-sync",
                )
                pool.open()
                self._sync_pool = pool
            return self._sync_pool

    def close_sync(self) -> None:
        """Close the synchronous pool of ``defer_sync`` (if it was opened); the next
        ``defer_sync`` opens it again. `close` closes it too."""
        with self._sync_lock:
            pool, self._sync_pool = self._sync_pool, None
        if pool is not None:
            pool.close()

    async def open(self) -> None:
        """Resolve the DSN and open the pool; raises `DatabaseUnavailable` if it cannot."""
        if self._pool is not None:
            return
        dsn = await self._resolve_dsn()
        self._tcp = tcp_defaults(dsn)
        try:  # one direct connection first: its error says why, where a pool only times out
            probe = await psycopg.AsyncConnection.connect(dsn, **self.connect_kwargs())
        except psycopg.OperationalError as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise DatabaseUnavailable(
                f"could not connect to PostgreSQL at {describe_dsn(dsn)}: {reason}"
            ) from None
        await probe.close()
        pool = AsyncConnectionPool(
            dsn,
            min_size=self.pool_min_size,
            max_size=self.pool_max_size,
            kwargs=self.connect_kwargs(),
            timeout=self.connect_timeout,
            open=False,
            name="asyncq",
            **reconnect_options(),
        )
        try:
            await pool.open(wait=True, timeout=self.connect_timeout)
        except PoolTimeout:
            await pool.close()
            raise DatabaseUnavailable(
                f"could not connect to PostgreSQL at {describe_dsn(dsn)}"
                f" within {self.connect_timeout:.0f}s"
            ) from None
        self._dsn, self._pool = dsn, pool
        self.writer.open(pool)

    async def close(self) -> None:
        """Close the pool and the LISTEN connection of `result`; waiters then raise `AppNotOpen`."""
        await self.results.close()
        pool, self._pool = self._pool, None
        await self.writer.close()
        if pool is not None:
            await pool.close()
        if self._sync_pool is not None:
            await anyio.to_thread.run_sync(self.close_sync)

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @asynccontextmanager
    async def connection(
        self, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``conn`` itself when given (the caller's transaction), else one from the pool."""
        if conn is not None:
            yield conn
            return
        async with self.pool.connection() as pooled:
            yield pooled

    # -- schema -----------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Create or upgrade the schema; returns the migration versions applied now.

        When a task of this App declares a limit, the index the claim of limited tasks
        reads is made too (`asyncq_jobs_ready_by_task`).
        """
        limited = any(task.limits.any for task in self.tasks.values())
        # Each statement of a migration runs once: preparing one gains nothing, and through
        # PgBouncer in transaction mode the prepared statement is lost or taken.
        kwargs = {**self.connect_kwargs(), "prepare_threshold": None}
        async with (
            await psycopg.AsyncConnection.connect(self.dsn, **kwargs) as lock,
            await psycopg.AsyncConnection.connect(self.dsn, **kwargs) as conn,
        ):
            return await migrate.apply(conn, self.schema, lock=lock, ready_by_task=limited)

    async def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        queues: Sequence[str] | None = None,
        tasks: Sequence[str] | None = None,
    ) -> RequeueResult:
        """Put failed (or cancelled) jobs back in the queue with fresh attempts.

        By ``ids``; or every failed job, narrowed to ``queues`` and ``tasks`` when given.
        Done, running and queued jobs are refused, with the reason in the result.
        """
        async with pools.connection(self.pool) as conn:
            return await admin.requeue(conn, self.store, ids, queues=queues, tasks=tasks)

    async def list_schedules(self) -> list[ScheduleInfo]:
        """Every schedule this App declares or the database holds: its cron, time zone,
        task, next and last slot, and the last job it made."""
        async with pools.connection(self.pool) as conn:
            return await admin.schedules(conn, self.store, self.schedules.values())

    async def cancel(self, *job_ids: int) -> dict[int, str]:
        """Cancel jobs, on whichever worker and host holds them.

        A queued job is ``cancelled`` at once. A running one is ``aborting``: the worker
        that runs it cancels its coroutine within a second (its ``finally`` blocks run)
        and the row ends ``cancelled``, never retried. Any other id maps to why not: its
        status (``done``, ``failed``, ``cancelled``) or ``not found``.
        """
        async with pools.connection(self.pool) as conn:
            return await admin.cancel(conn, self.store, job_ids)

    async def emit_event(self, key: str, payload: Any = None, *, conn: Any = None) -> bool:
        """Emit the event ``key`` with ``payload`` (JSON, at most 1 MiB): every job waiting
        for it (``ctx.wait_for_event(key)``) is queued, and a wait that starts later returns
        it at once. A key is emitted once: the first emit wins and is kept (True); a later
        one changes nothing (False). With ``conn`` (a psycopg ``AsyncConnection``, or a
        SQLAlchemy session), the emit joins the caller's transaction: it commits, and
        wakes its waiters, with it, or not at all. Events are kept for the App's
        retention."""
        text = workflow.event_json(key, payload)
        if conn is not None:
            own = await connections.async_connection(conn)
            return await self.store.emit_event(own, key=key, payload=text)
        async with pools.connection(self.pool) as pooled:
            return await self.store.emit_event(pooled, key=key, payload=text)

    async def retry(self, job_id: int, *, from_step: str | None = None) -> str:
        """Run a job that ended (``done``, ``failed`` or ``cancelled``) again: queued, its
        attempts reset, the steps that finished keeping their results (the job goes on
        from where it stopped). With ``from_step``, that step (its first call) and every
        step recorded after it run again; earlier ones keep their results. Returns the
        status the job had; `JobNotFound` for an unknown id, `ValueError` for a job that
        has not ended, has no step of that name, or whose unique key a live job holds."""
        async with pools.connection(self.pool) as conn:
            return (await admin.retry(conn, self.store, job_id, from_step=from_step)).was

    async def workers(self) -> list[WorkerState]:
        """Every worker listed in the database, on any host: live ones first, then those
        that stopped refreshing their row (dead: killed, crashed, or cut off), each with
        its host and pid, asyncq version, App, queues, concurrency, jobs running, when it
        started and when it was last seen."""
        async with pools.connection(self.pool) as conn:
            return await admin.workers(conn, self.store)

    async def pause(self, queue: str) -> bool:
        """Stop every worker claiming from ``queue`` (running jobs finish; defers still
        write). False if it was paused already."""
        async with pools.connection(self.pool) as conn:
            return await admin.pause(conn, self.store, queue)

    async def resume(self, queue: str) -> bool:
        """Let workers claim from ``queue`` again. False if it was not paused."""
        async with pools.connection(self.pool) as conn:
            return await admin.resume(conn, self.store, queue)

    async def set_limits(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        group_concurrency: int | None = None,
    ) -> None:
        """Override limits of the task or the queue ``name`` (a queue's apply to each of its
        tasks; a task's over its queue's): kept in the database, every worker claims by
        them within a second, and they hold until `reset_limits`. The limits declared on
        ``@app.task`` are the defaults; a limit not given keeps the override there is (or
        the code's). Raises `ConfigurationError` for a bad limit (a concurrency below 1, a
        rate that does not parse), writing nothing; a name that is neither a task nor a
        queue of this App is kept, with a warning (the workers of an App that has such a
        task apply it)."""
        async with pools.connection(self.pool) as conn:
            await admin.set_limits(
                conn,
                self.store,
                name,
                self._task_queues(),
                concurrency=concurrency,
                rate_limit=rate_limit,
                group_concurrency=group_concurrency,
            )

    async def reset_limits(self, name: str) -> bool:
        """Drop the overrides of the task or queue ``name``: the limits in code hold again,
        on every worker within a second. False if it had none."""
        async with pools.connection(self.pool) as conn:
            return await admin.reset_limits(conn, self.store, name, self._task_queues())

    async def limits(self) -> list[admin.LimitInfo]:
        """Every task's limits in force with their sources (code, override, queue
        override), then the queues' overrides and those of tasks this App does not have."""
        async with pools.connection(self.pool) as conn:
            return await admin.limits(conn, self.store, self._task_limits())

    def _task_queues(self) -> dict[str, str]:
        return {name: task.queue for name, task in self.tasks.items()}

    def _task_limits(self) -> list[tuple[str, str, TaskLimits]]:
        return [(name, task.queue, task.limits) for name, task in self.tasks.items()]

    async def result(self, job_id: int, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Wait for job ``job_id`` to end; return what its task returned (decoded from
        JSON; None when it returned None or its result could not be stored).

        Raises `JobFailed` (with ``.last_error``) if the job failed, `JobCancelled` if it
        was cancelled, `JobNotFound` if no job has this id, `TimeoutError` after
        ``timeout`` seconds if it has not ended. The job is looked up once however short
        the timeout: with ``timeout=0`` a job that has ended answers (its result, or its
        error) and one that has not raises `TimeoutError`. Woken by the notification of
        the statement that ends the job; every ``result_poll_interval`` seconds (an App
        option) the jobs still waited for are looked up too, in one query (with
        ``App(listen=False)``, only then)."""
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise TypeError(f"a job id is an int, not {type(job_id).__name__}")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or a number of seconds >= 0, not {timeout!r}")
        if self._pool is None:
            raise AppNotOpen()
        return await self.results.wait(job_id, timeout)

    # -- workers ----------------------------------------------------------------

    async def run_worker(
        self, queues: Sequence[str] | None = None, **options: Unpack[WorkerOptions]
    ) -> WorkerStats:
        """Run a worker until SIGTERM/SIGINT (or cancellation); with ``drain``, until no job
        is ready or running. Opens the App if it is not open.

        Options (defaults and bounds in `asyncq.worker.settings.WorkerSettings`, the same
        as ``asyncq worker``'s): ``concurrency`` (10), ``threads`` (the concurrency: for
        plain ``def`` tasks), ``prefetch`` (400: the most jobs claimed ahead while jobs are
        short), ``batch_size`` (the concurrency plus the prefetch, at most 100), ``lease``
        (30 s), ``grace`` (20 s), ``poll_interval`` (1 s), ``drain``,
        ``handle_signals`` (True), and, advanced, ``listener_health_interval`` (10 s: the
        LISTEN connection checks its health after that long without a notification) and
        ``listener_health_timeout`` (5 s: it gives up after that long without an answer).
        A bad option raises `ConfigurationError` before anything connects."""
        return await self._run_worker(queues, options)

    async def _run_worker(
        self, queues: Sequence[str] | None, options: WorkerOptions, *, rate_limits: bool = True
    ) -> WorkerStats:
        """`run_worker`; without ``rate_limits``, its claims leave the tasks' rate limits
        out (`asyncq.testing.drain`, which waits for no time)."""
        settings = worker_settings.from_options(
            queues, retention=self.retention, app_path=self.import_path, **options
        )
        observers = list(self._observers)
        metrics = None
        if settings.metrics_port is not None:
            from asyncq.metrics import WorkerMetrics

            metrics = WorkerMetrics()
            metrics.serve(settings.metrics_port, settings.metrics_host)
            observers.append(metrics)
        opened_here = self._pool is None
        await self.open()
        try:
            await self._size_pool_for(settings.concurrency)
            worker = Worker(
                worker_id=f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}",
                tasks=self.tasks,
                app_pool=self.pool,
                store=self.store,
                conninfo=self.dsn,
                connect_kwargs=self.connect_kwargs(),
                listen_conninfo=self.listen_dsn if self.listen else None,
                settings=settings,
                middleware=self._middleware,
                observers=observers,
                schedules=list(self.schedules.values()),
                limits=ClaimLimits.of(
                    (name, task.limits if rate_limits else task.limits.without_rate())
                    for name, task in self.tasks.items()
                ),
                task_limits=[
                    (name, task.queue, task.limits if rate_limits else task.limits.without_rate())
                    for name, task in self.tasks.items()
                ],
                rate_limits=rate_limits,
            )
            return await worker.run()
        finally:
            if metrics is not None:
                metrics.close()
            if opened_here:
                await self.close()

    async def _size_pool_for(self, concurrency: int) -> None:
        """Room in the pool for every running task to hold a connection and defer."""
        wanted = concurrency + POOL_HEADROOM
        pool = self.pool
        if pool.max_size >= wanted:
            return
        if self._pool_size_given:
            logger.warning(
                "the App's pool has %d connections for %d concurrent jobs: tasks that hold"
                " a connection while they defer may wait for one (App(pool_max_size=%d) or"
                " more gives each its own)",
                pool.max_size,
                concurrency,
                wanted,
                extra={"action": "pool_small"},
            )
            return
        await pool.resize(min_size=pool.min_size, max_size=wanted)
