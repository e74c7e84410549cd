"""The worker's side: the two asyncq tasks that run Django's tasks.

Every job that `AsyncqBackend.enqueue` writes is a job of one of two asyncq tasks: a
plain ``def`` (`SYNC_TASK`) for a Django task that is a plain function, which workers
run in their thread pool, and an ``async def`` (`ASYNC_TASK`) for a coroutine function,
which they run on their event loop. Its arguments say which Django task to run and how:
its import path, its ``args`` and ``kwargs``, and the backend, queue, priority,
``run_after`` and enqueue time of the `django.tasks.Task` that enqueued it.

Around each call, as Django does around a request: the connections of the thread that
runs it are closed when they are unusable or past ``CONN_MAX_AGE``
(``close_old_connections``), before and after; a coroutine function runs in a
``ThreadSensitiveContext`` of its own, as an ASGI request does. The signals
``task_started`` and ``task_finished`` are sent; an attempt the worker stops (its
timeout, a cancel, a shutdown) sends no ``task_finished``, since its function did not
end (or ends after its outcome is written, in a thread).

What the function returns must be JSON (after Django's ``normalize_json``): anything
else fails the job at once, without another attempt, since the function has run.
"""

from __future__ import annotations

import builtins
import inspect
import traceback
from dataclasses import replace
from datetime import datetime
from typing import Any

import anyio
from asgiref.sync import ThreadSensitiveContext, async_to_sync, sync_to_async
from django.db import close_old_connections
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from asyncq import codec
from asyncq.app import App
from asyncq.control import Discard, Snooze
from asyncq.job import JobContext, current_job

SYNC_TASK = "django.tasks"
"""The asyncq task name of the jobs of Django tasks that are plain functions."""
ASYNC_TASK = "django.tasks.async"
"""The asyncq task name of the jobs of Django tasks that are coroutine functions."""
TASK_NAMES = (SYNC_TASK, ASYNC_TASK)

# How long a stopped async attempt's task_finished receivers may run.
_SIGNAL_DEADLINE = 5.0


def register(app: App) -> None:
    """Register the two runner tasks on ``app``."""
    app.task(name=SYNC_TASK)(run)
    app.task(name=ASYNC_TASK)(arun)


def run(
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    queue_name: str,
    priority: int,
    run_after: str | None = None,
    enqueued_at: str | None = None,
) -> Any:
    """Run the Django task at ``task`` (in a thread of the worker)."""
    close_old_connections()
    try:
        django_task = resolve(task, backend, queue_name, priority, run_after)
        result = running_result(django_task, current_job(), args, kwargs, enqueued_at)
        sender = type(django_task.get_backend())
        task_started.send(sender=sender, task_result=result)
        try:
            call_args = [TaskContext(task_result=result), *result.args]
            if not django_task.takes_context:
                call_args = call_args[1:]
            if inspect.iscoroutinefunction(django_task.func):  # it became one since
                value = async_to_sync(django_task.func)(*call_args, **result.kwargs)
            else:
                value = django_task.func(*call_args, **result.kwargs)
            value = returned(django_task, value)
        except BaseException as exc:
            if not current_job().stop_requested:
                ended(result, exc)
                task_finished.send(sender=sender, task_result=result)
            raise
        succeeded(result, value)
        if not current_job().stop_requested:
            task_finished.send(sender=sender, task_result=result)
        return value
    finally:
        close_old_connections()


async def arun(
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    queue_name: str,
    priority: int,
    run_after: str | None = None,
    enqueued_at: str | None = None,
) -> Any:
    """Run the Django task at ``task`` (a coroutine function, on the worker's loop)."""
    async with ThreadSensitiveContext():
        await sync_to_async(close_old_connections)()
        try:
            return await _arun(
                task, args, kwargs, backend, queue_name, priority, run_after, enqueued_at
            )
        finally:
            with anyio.move_on_after(_SIGNAL_DEADLINE, shield=True):
                await sync_to_async(close_old_connections)()


async def _arun(
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    queue_name: str,
    priority: int,
    run_after: str | None,
    enqueued_at: str | None,
) -> Any:
    django_task = resolve(task, backend, queue_name, priority, run_after)
    result = running_result(django_task, current_job(), args, kwargs, enqueued_at)
    sender = type(django_task.get_backend())
    await task_started.asend(sender=sender, task_result=result)
    try:
        call_args = [TaskContext(task_result=result), *result.args]
        if not django_task.takes_context:
            call_args = call_args[1:]
        if inspect.iscoroutinefunction(django_task.func):
            value = await django_task.func(*call_args, **result.kwargs)
        else:  # it is no longer one
            value = await sync_to_async(django_task.func)(*call_args, **result.kwargs)
        value = returned(django_task, value)
    except anyio.get_cancelled_exc_class():
        raise  # stopped by the worker: its outcome is not this function's to tell
    except BaseException as exc:
        ended(result, exc)
        with anyio.move_on_after(_SIGNAL_DEADLINE, shield=True):
            await task_finished.asend(sender=sender, task_result=result)
        raise
    succeeded(result, value)
    await task_finished.asend(sender=sender, task_result=result)
    return value


def resolve(
    path: str, backend: str, queue_name: str, priority: int, run_after: str | None
) -> Task[Any, Any]:
    """The `django.tasks.Task` at ``path``, with the options it was enqueued with."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(
            f"{path} is a {type(found).__name__}, not a django.tasks Task (a function"
            " decorated with @task)"
        )
    return replace(
        found,
        backend=backend,
        queue_name=queue_name,
        priority=priority,
        run_after=None if run_after is None else datetime.fromisoformat(run_after),
    )


def worker_ids(attempts: int, latest: str | None) -> list[str]:
    """One entry per attempt: asyncq keeps the worker of the latest attempt only (the
    row's ``locked_by``), so the earlier ones are empty strings."""
    if attempts <= 0:
        return []
    return [""] * (attempts - 1) + [latest or ""]


def running_result(
    task: Task[Any, Any],
    job: JobContext,
    args: list[Any],
    kwargs: dict[str, Any],
    enqueued_at: str | None,
) -> TaskResult[Any, Any]:
    """The `TaskResult` of the attempt that starts now, as the signals and a task that
    takes its context see it (made from the job the worker holds, without a query)."""
    now = timezone.now()
    return TaskResult(
        task=task,
        id=str(job.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None if enqueued_at is None else datetime.fromisoformat(enqueued_at),
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=worker_ids(job.attempt, job.worker),
    )


def returned(task: Task[Any, Any], value: Any) -> Any:
    """What the function returned, as asyncq stores it; `Discard` (fail now: the
    function has run, and would return the same again) when it is not JSON."""
    try:
        value = normalize_json(value)
        codec.encode_result(task.module_path, value)
    except (TypeError, ValueError) as exc:  # codec's ArgumentsError is a TypeError
        raise Discard(
            f"TypeError: the return value of {task.module_path} is not JSON: {exc}"
        ) from None
    return value


def succeeded(result: TaskResult[Any, Any], value: Any) -> None:
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)


def ended(result: TaskResult[Any, Any], exc: BaseException) -> None:
    """``result`` after an attempt that raised ``exc``: FAILED when asyncq will not try
    again, else READY."""
    job = current_job()
    last = isinstance(exc, Discard) or job.attempt >= job.max_attempts
    if isinstance(exc, Snooze):
        last = False
    object.__setattr__(
        result, "status", TaskResultStatus.FAILED if last else TaskResultStatus.READY
    )
    if last:
        object.__setattr__(result, "finished_at", timezone.now())
    kind = type(exc)
    path = (
        exception_path(f"Discard: {exc}")
        if isinstance(exc, Discard)
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    result.errors.append(
        TaskError(exception_class_path=path, traceback="".join(traceback.format_exception(exc)))
    )


# asyncq's own words at the head of a last_error, for what no exception was raised by.
_ASYNCQ_ERRORS = {
    "Cancelled": "asyncq.errors.JobCancelled",
    "Discard": "asyncq.control.Discard",
    "Retry": "asyncq.control.Retry",
}
_FALLBACK = "asyncq.errors.JobFailed"


def task_error(last_error: str) -> TaskError:
    """A `TaskError` for a job's ``last_error``: its ``traceback`` is the text asyncq
    stored, its ``exception_class_path`` the class that text names, where it names one
    (``module.Class: message``, as Python prints an exception; a builtin's without its
    module). A ``Discard`` whose reason reads that way names the class of its reason.
    Otherwise, and for asyncq's own errors (``LeaseExpired``, ``HandedBack``, ...),
    ``asyncq.errors.JobFailed``; a cancel is ``asyncq.errors.JobCancelled``."""
    return TaskError(exception_class_path=exception_path(last_error), traceback=last_error)


def exception_path(last_error: str) -> str:
    head = last_error.lstrip().partition("\n")[0]
    name, colon, rest = head.partition(":")
    if name == "Discard" and colon:
        inner = _named(rest.strip().partition(":")[0])
        if inner is not None:
            return inner
    if name in _ASYNCQ_ERRORS:
        return _ASYNCQ_ERRORS[name]
    return _named(name) or _FALLBACK


def _named(name: str) -> str | None:
    """The import path of the exception class ``name`` names, without importing it."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    if len(parts) > 1:
        return name
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return f"builtins.{name}"
    return None
