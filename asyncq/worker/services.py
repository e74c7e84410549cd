"""How the worker's background services run: each is an object with a ``name`` and
``run(task_status=...)``, started by the supervisor from a list, in one task group.

A database call that fails for a transient reason (`asyncq.transient`) is reported to
the observer and tried again after a jittered backoff that grows with the failures in
a row: `Tries` counts them, and `retrying` and `every` are the two shapes of loop built
on it. Any other error stops the worker: it would fail the same way again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus

from asyncq.transient import TRANSIENT_ERRORS, backoff_delay, is_transient
from asyncq.worker.observer import Observer

T = TypeVar("T")


class Service(Protocol):
    name: str

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...


async def start_all(group: TaskGroup, services: Sequence[Service]) -> None:
    """Start ``services`` in ``group`` side by side (the listener's connection, say, is
    made while the others start); return when every one has said it started. One that
    fails first fails the group, with its own error."""
    left = len(services)
    all_started = anyio.Event()

    async def start(service: Service) -> None:
        nonlocal left
        await group.start(service.run)
        left -= 1
        if not left:
            all_started.set()

    for service in services:
        group.start_soon(start, service, name=f"asyncq start {service.name}")
    if services:
        await all_started.wait()


class Tries:
    """A service's transient failures in a row, and the wait before its next try."""

    def __init__(self, service: str, observer: Observer) -> None:
        self.service = service
        self.observer = observer
        self.failures = 0

    def wait_after(self, error: BaseException, delay: float | None = None) -> float:
        """Count ``error`` and report it; the seconds to wait before the next try (the
        backoff, unless the service tries again after ``delay`` anyway)."""
        self.failures += 1
        if delay is None:
            delay = backoff_delay(self.failures)
        self.observer.service_failed(self.service, error, delay)
        return delay

    async def failed(self, error: BaseException) -> None:
        await anyio.sleep(self.wait_after(error))

    def succeeded(self) -> None:
        self.failures = 0


async def retrying(service: str, call: Callable[[], Awaitable[T]], observer: Observer) -> T:
    """``call()`` until it returns, waiting longer after each transient failure in a row."""
    tries = Tries(service, observer)
    while True:
        try:
            return await call()
        except TRANSIENT_ERRORS as exc:
            if not is_transient(exc):
                raise
            await tries.failed(exc)


async def every(
    service: str,
    interval: Callable[[], float],
    call: Callable[[], Awaitable[object]],
    observer: Observer,
) -> None:
    """``call()`` after every ``interval()`` seconds, for ever. A transient failure (a call
    past its deadline too) is reported, and the next turn is its retry."""
    tries = Tries(service, observer)
    while True:
        await anyio.sleep(interval())
        try:
            await call()
        except TRANSIENT_ERRORS as exc:
            if not is_transient(exc):
                raise
            tries.wait_after(exc, interval())
        else:
            tries.succeeded()
