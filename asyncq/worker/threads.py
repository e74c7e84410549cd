"""The threads that run tasks written as plain ``def`` functions.

At most ``size`` functions run at once, each in a thread of its own, started when first
needed and kept for the next. A thread cannot be stopped from outside: when an attempt
is stopped (its timeout, a cancel, a lost lease, the end of a shutdown's grace), the
awaiting coroutine ends at once and the attempt's outcome is written, while the function
runs on in its thread to its own end. Its return value or error is then dropped (and
logged), and its ``current_job().stop_requested`` is true, for functions that look. An
attempt stopped before a thread took it never starts.

The threads are daemon threads: a worker that exits does not wait for them, and a
function still running then is stopped with the process, as a killed worker's would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("asyncq.worker")


@dataclass(slots=True)
class _Call:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    context: contextvars.Context
    fn: Callable[[], Any]
    stop: threading.Event
    label: str


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the attempt was stopped meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Threads:
    def __init__(self, size: int, *, name: str = "asyncq-task") -> None:
        self.size = size
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._waiting = 0  # calls queued that no thread has taken yet
        self._idle = 0  # threads waiting for a call
        self._closed = False

    async def run(self, fn: Callable[[], Any], *, stop: threading.Event, label: str) -> Any:
        """``fn()`` in a thread, in a copy of the caller's context; what it returns or
        raises. Cancelled, it sets ``stop`` and ends at once: ``fn`` runs on (above)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = _Call(loop, future, contextvars.copy_context(), fn, stop, label)
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker's task threads are closed")
            self._waiting += 1
            if self._waiting > self._idle and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._serve, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._calls.put(call)
        try:
            return await future
        except asyncio.CancelledError:
            stop.set()
            raise

    def close(self) -> None:
        """Let each thread end once it is idle (the busy ones after their function)."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._calls.put(None)

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._calls.get()
            with self._lock:
                self._idle -= 1
                if call is not None:
                    self._waiting -= 1
            if call is None:
                return
            if call.stop.is_set():
                continue  # stopped before it started: it never runs
            result = error = None
            try:
                result = call.context.run(call.fn)
            except BaseException as exc:  # noqa: BLE001 - it is the attempt's error
                error = exc
            if call.stop.is_set():
                logger.warning(
                    "%s: its function ended in its thread after the attempt was stopped;"
                    " what it %s is dropped",
                    call.label,
                    "raised" if error is not None else "returned",
                    extra={"action": "thread_ran_on"},
                )
                continue
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
                call.loop.call_soon_threadsafe(_settle, call.future, result, error)
            del call, result, error
