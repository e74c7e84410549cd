"""`AsyncqBackend`: asyncq as a backend of Django's tasks framework (``django.tasks``)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, cast

import anyio
from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.tasks import Task, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json

from asyncq import admin
from asyncq.admin import JobDetail
from asyncq.app import App
from asyncq.contrib.django import db, runner
from asyncq.errors import ArgumentsError, AsyncqError
from asyncq.task import Task as AsyncqTask

APP_NAME = "asyncq.contrib.django"
OPTIONS = ("database", "schema", "dsn", "max_attempts", "queue_map", "app_options")
DEFAULT_MAX_ATTEMPTS = 3
# What enqueue stores in a job's args, beside args, kwargs, run_after and enqueued_at.
_STORED = frozenset({"task", "backend", "queue_name", "priority"})
_STATUSES = {
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


class AsyncqBackend(BaseTaskBackend):
    """A ``django.tasks`` backend that queues each task as an asyncq job.

    ``enqueue`` writes the job on Django's own connection to the database ``database``
    (in its transaction: inside ``transaction.atomic()``, the job commits or rolls back
    with everything else); ``get_result`` reads it back there. Workers run the jobs
    (``python manage.py asyncq_worker``): a plain function in their thread pool, a
    coroutine function on their event loop.

    ``OPTIONS`` (all optional):

    - ``database``: the ``DATABASES`` alias that jobs are written on and read from
      (``"default"``). It must be PostgreSQL, through psycopg 3.
    - ``schema``: the schema of asyncq's tables (``App(schema=...)``); by default the
      connection's current schema (``public``).
    - ``max_attempts``: attempts of a job before it fails (3); a failed attempt is
      retried after a backoff. 1 runs each task at most once per enqueue, unless a
      worker dies while it runs.
    - ``queue_map``: asyncq queue names for Django queue names (``{"emails":
      "django-emails"}``); a queue not named there keeps its name.
    - ``dsn``: the libpq DSN of the worker's connections, when it must reach the same
      database otherwise than Django does; by default it is built from ``DATABASES``.
    - ``app_options``: more keyword arguments of the worker's `asyncq.App`
      (``pool_max_size``, ``listen_dsn``, ``retention``, ``tracing``, ...).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]['OPTIONS']"
        if not isinstance(self.options, Mapping):
            raise ImproperlyConfigured(f"{where} must be a dict, not {self.options!r}")
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ImproperlyConfigured(
                f"{where} has unknown keys {', '.join(map(repr, unknown))}:"
                f" the keys are {', '.join(OPTIONS)}"
            )
        self.database: str = self.options.get("database", DEFAULT_DB_ALIAS)
        if not isinstance(self.database, str):
            raise ImproperlyConfigured(f"{where}['database'] must be a DATABASES alias")
        self.dsn: str | None = self.options.get("dsn")
        if self.dsn is not None and not (isinstance(self.dsn, str) and self.dsn.strip()):
            raise ImproperlyConfigured(f"{where}['dsn'] must be a libpq DSN")
        self.max_attempts: int = self.options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ImproperlyConfigured(f"{where}['max_attempts'] must be an int >= 1")
        queue_map = self.options.get("queue_map", {})
        if not isinstance(queue_map, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in queue_map.items()
        ):
            raise ImproperlyConfigured(
                f"{where}['queue_map'] must map Django queue names to asyncq queue names"
            )
        self.queue_map: dict[str, str] = dict(queue_map)
        app_options = self.options.get("app_options", {})
        if not isinstance(app_options, Mapping):
            raise ImproperlyConfigured(f"{where}['app_options'] must be a dict")
        self.app_options: dict[str, Any] = dict(app_options)
        self.schema: str | None = self.options.get("schema")
        # The App whose tasks write the jobs. Always given Django's connection, it opens
        # none of its own, and needs no DSN.
        self._writer = self._app(None)
        self._runners: dict[bool, AsyncqTask[Any, Any]] = {
            False: self._writer.tasks[runner.SYNC_TASK],
            True: self._writer.tasks[runner.ASYNC_TASK],
        }

    def _app(self, dsn: str | None) -> App:
        try:
            app = App(dsn, schema=self.schema, **self.app_options)
        except (TypeError, AsyncqError) as exc:
            raise ImproperlyConfigured(
                f"TASKS[{self.alias!r}]['OPTIONS'] do not make an asyncq App: {exc}"
            ) from None
        runner.register(app)
        return app

    def make_app(self) -> App:
        """A new `asyncq.App` for this backend's jobs, for a worker or the ``asyncq``
        command: the ``dsn`` option, else a DSN built from ``DATABASES[database]`` as
        it is now (a test run's test database, during one)."""
        return self._app(self.dsn or db.database_dsn(self.database))

    def asyncq_queue(self, queue_name: str) -> str:
        """The asyncq queue of the Django queue ``queue_name`` (see ``queue_map``)."""
        return self.queue_map.get(queue_name, queue_name)

    def worker_queues(self) -> list[str] | None:
        """The asyncq queues of the Django queues this backend allows (``QUEUES``), what
        its workers serve; None (every queue) when ``QUEUES`` is empty."""
        if not self.queues:
            return None
        return sorted({self.asyncq_queue(name) for name in self.queues})

    # -- django.tasks -------------------------------------------------------------------

    def enqueue(
        self, task: Task[Any, Any], args: Iterable[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[Any, Any]:
        """Write the job on Django's connection, in its transaction, and return its
        `TaskResult` (``READY``; its ``id`` is the asyncq job's id).

        Arguments must be JSON (after Django's ``normalize_json``): anything else
        raises `asyncq.ArgumentsError` (a ``TypeError``), and nothing is written."""
        self.validate_task(task)
        try:
            stored_args = cast("list[Any]", normalize_json(list(args)))
            stored_kwargs = cast("dict[str, Any]", normalize_json(dict(kwargs)))
        except (TypeError, ValueError) as exc:
            raise ArgumentsError(
                f"the arguments of {task.module_path} must be JSON-serialisable: {exc}"
            ) from None
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)  # USE_TZ = False: the current zone
        enqueued_at = timezone.now()
        asyncq_task = self._runners[_is_async(task)]
        deferrer = asyncq_task.options(
            queue=self.asyncq_queue(task.queue_name),
            priority=task.priority,
            run_at=run_after,
            max_attempts=self.max_attempts,
            conn=db.psycopg_connection(connections[self.database]),
        )
        with connections[self.database].wrap_database_errors:
            job_id = deferrer.defer_sync(
                task=task.module_path,
                args=stored_args,
                kwargs=stored_kwargs,
                backend=self.alias,
                queue_name=task.queue_name,
                priority=task.priority,
                run_after=None if task.run_after is None else task.run_after.isoformat(),
                enqueued_at=enqueued_at.isoformat(),
            )
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=stored_args,
            kwargs=stored_kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task's result as its job's row says now, read on Django's connection (in
        its transaction). ``TaskResultDoesNotExist`` for an id that is no job of a
        Django task (never was, or was pruned after its retention)."""
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not 0 < job_id < 2**63:
            raise TaskResultDoesNotExist(result_id)
        wrapper = connections[self.database]
        with wrapper.wrap_database_errors:
            detail = admin.job_sync(db.psycopg_connection(wrapper), self._writer.store, job_id)
        if (
            detail is None
            or detail.task_name not in runner.TASK_NAMES
            or not isinstance(detail.args, dict)
            or not detail.args.keys() >= _STORED
        ):  # no job, or not one that enqueue wrote
            raise TaskResultDoesNotExist(result_id)
        return task_result(detail)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's system checks: ``database`` is PostgreSQL through psycopg 3; the app
        ``asyncq.contrib.django`` is installed (its migrations create asyncq's tables)."""
        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        try:
            db.check_postgresql(self.database)
        except ImproperlyConfigured as exc:
            messages.append(checks.Error(str(exc), obj=f"TASKS[{self.alias!r}]", id="asyncq.E001"))
        if not apps.is_installed(APP_NAME):
            messages.append(
                checks.Warning(
                    f"{APP_NAME} is not in INSTALLED_APPS: its migrations create asyncq's"
                    " tables, and its commands run workers",
                    hint=f"add {APP_NAME!r} to INSTALLED_APPS, or create the tables with"
                    f" `asyncq migrate {APP_NAME}:app`",
                    obj=f"TASKS[{self.alias!r}]",
                    id="asyncq.W001",
                )
            )
        return messages


def _is_async(task: Task[Any, Any]) -> bool:
    return inspect.iscoroutinefunction(task.func)


def task_result(detail: JobDetail) -> TaskResult[Any, Any]:
    """The `TaskResult` of a Django task's job, from its row.

    ``status``: queued is ``READY``, running ``RUNNING``, done ``SUCCESSFUL``, failed
    and cancelled ``FAILED``. ``errors``: the row's ``last_error`` (asyncq keeps the
    latest attempt's error only), and for a cancelled job an ``asyncq.JobCancelled``
    last. ``started_at`` and ``last_attempted_at``: when the latest attempt was claimed,
    moved on by each renewal of its lease while it ran (``locked_at``). ``worker_ids``:
    one per attempt, the latest's worker last (see `runner.worker_ids`)."""
    stored = detail.args
    django_task = runner.resolve(
        stored["task"],
        stored["backend"],
        stored["queue_name"],
        stored["priority"],
        stored.get("run_after"),
    )
    errors = [] if detail.last_error is None else [runner.task_error(detail.last_error)]
    if detail.status == "cancelled" and not (
        errors and errors[-1].exception_class_path == "asyncq.errors.JobCancelled"
    ):
        errors.append(
            runner.task_error(f"Cancelled: job {detail.id} was cancelled before it ended")
        )
    attempted = detail.locked_at if detail.attempts_used > 0 else None
    enqueued = stored.get("enqueued_at")
    result: TaskResult[Any, Any] = TaskResult(
        task=django_task,
        id=str(detail.id),
        status=_STATUSES[detail.status],
        enqueued_at=detail.created_at if enqueued is None else datetime.fromisoformat(enqueued),
        started_at=attempted,
        finished_at=detail.finished_at,
        last_attempted_at=attempted,
        args=stored.get("args", []),
        kwargs=stored.get("kwargs", {}),
        backend=django_task.backend,
        errors=errors,
        worker_ids=runner.worker_ids(detail.attempts_used, detail.locked_by),
    )
    if detail.status == "done":
        object.__setattr__(result, "_return_value", detail.result)
    return result


def asyncq_backends() -> Iterator[AsyncqBackend]:
    """The backends of ``TASKS`` that are asyncq's."""
    for backend in task_backends.all():
        if isinstance(backend, AsyncqBackend):
            yield backend


def migrate_database(alias: str) -> list[int]:
    """Create or upgrade asyncq's tables for every asyncq backend that writes on
    ``DATABASES[alias]``, there (what the migration of ``asyncq.contrib.django`` runs);
    returns the versions applied."""
    applied: list[int] = []
    done: set[str | None] = set()
    for backend in asyncq_backends():
        if backend.database != alias or backend.schema in done:
            continue
        done.add(backend.schema)
        applied += anyio.run(_migrate, backend._app(db.database_dsn(alias)))
    return applied


async def _migrate(app: App) -> list[int]:
    async with app:
        return await app.migrate()
