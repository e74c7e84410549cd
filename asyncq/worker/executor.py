"""Run one attempt: find the task, decode the job's arguments, set the job context,
and call the function through the middleware chain. Whatever the attempt raises
propagates: the dispatcher catches it and `outcomes.decide` makes it an outcome."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from asyncq import codec
from asyncq.errors import TaskNotFound
from asyncq.job import Job, JobContext, current_job, running_job
from asyncq.worker.outcomes import Policy
from asyncq.worker.threads import Threads
from asyncq.workflow import Gateway

CallNext = Callable[[], Awaitable[Any]]
Middleware = Callable[[JobContext, CallNext], Awaitable[Any]]
"""``async def middleware(job, call_next) -> result``: runs around every attempt; it
must await ``call_next()`` once and return (or change) what it returns. What it raises
is the attempt's error."""


class RunnableTask(Policy, Protocol):
    """What the worker needs of a task (`asyncq.Task` is one). A ``blocking`` task (a
    plain ``def``) is run by `prepare_stored`'s call in a thread, any other by awaiting
    `call_stored`'s coroutine."""

    @property
    def name(self) -> str: ...

    @property
    def blocking(self) -> bool: ...

    def call_stored(self, stored_args: Any) -> Coroutine[Any, Any, Any]: ...

    def prepare_stored(self, stored_args: Any) -> Callable[[], Any]: ...


class Executor:
    def __init__(
        self,
        *,
        tasks: Mapping[str, RunnableTask],
        worker: str,
        threads: Threads,
        middleware: Sequence[Middleware] = (),
        gateway: Gateway | None = None,
    ) -> None:
        self.tasks = tasks
        self.worker = worker
        self.threads = threads
        self.middleware = tuple(middleware)
        self.gateway = gateway  # what the tasks' workflow calls write through

    async def run(self, job: Job, task: RunnableTask | None) -> Any:
        """Run ``job`` with ``task`` (None: unknown here) to its end; returns its result."""
        token = running_job.set((job, self.worker, None, self.gateway))
        try:
            return await self.attempt(job, task)
        finally:
            running_job.reset(token)

    def attempt(self, job: Job, task: RunnableTask | None) -> Awaitable[Any]:
        """What runs ``job``'s attempt, for a caller that awaits it with `running_job` set
        to ``(job, worker, None, gateway)`` (as `run` does). On the path of nearly every attempt (a
        coroutine function, no middleware) it is the task's own coroutine, with no frame
        of the executor's around it to resume each time the task does."""
        if task is None or task.blocking or self.middleware:
            return self._run_wrapped(job, task)
        return task.call_stored(codec.decode(job.args))

    async def _run_wrapped(self, job: Job, task: RunnableTask | None) -> Any:
        stop = threading.Event() if task is not None and task.blocking else None
        # A plain def task runs in a thread, which cannot suspend its job: its context has
        # no workflow (`job_context`), only its progress.
        token = running_job.set((job, self.worker, stop, self.gateway))
        try:
            if task is None:
                raise TaskNotFound(
                    f"unknown task {job.task_name!r}: no task of that name is registered"
                    " on this worker's App"
                )
            args = codec.decode(job.args)
            if stop is None:
                return await self._chain(current_job(), lambda: task.call_stored(args))
            call = task.prepare_stored(args)
            label = f"job {job.id} ({job.task_name})"
            return await self._chain(
                current_job(), lambda: self.threads.run(call, stop=stop, label=label)
            )
        finally:
            running_job.reset(token)

    def _chain(self, context: JobContext, call: CallNext) -> Awaitable[Any]:
        for middleware in reversed(self.middleware):
            call = _bind(middleware, context, call)
        return call()


def _bind(middleware: Middleware, context: JobContext, call_next: CallNext) -> CallNext:
    return lambda: middleware(context, call_next)
