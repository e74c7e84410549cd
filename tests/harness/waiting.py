"""Waiting for a condition, never for a fixed time: poll it until a deadline, and fail with
an AssertionError that says what was awaited.

`wait_until` blocks (worker processes, CLI commands, the server's state); `until` is its
twin for coroutines, and lets the event loop run between looks. The deadline is a safety
net, not what a test measures: keep it generous (the default), unless the test means that
something slower (a poll, a heartbeat) must not be what made the condition come true.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

WITHIN = 30.0


def wait_until(predicate: Callable[[], T], within: float = WITHIN, what: str = "a condition") -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; fail after
    ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        time.sleep(0.05)


async def until(predicate: Callable[[], T], within: float = WITHIN, what: str = "a condition") -> T:
    """`wait_until` in a coroutine: the event loop runs other tasks between looks."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        await anyio.sleep(0.01)
