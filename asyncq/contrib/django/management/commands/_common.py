"""What the asyncq management commands share."""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from django.core.management.base import CommandError, CommandParser
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends

from asyncq.contrib.django.backend import AsyncqBackend

T = TypeVar("T")


def add_backend_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--backend",
        default=DEFAULT_TASK_BACKEND_ALIAS,
        help="the TASKS alias of the asyncq backend (default: %(default)s)",
    )


def asyncq_backend(alias: str) -> AsyncqBackend:
    if alias not in task_backends.settings:
        raise CommandError(f"TASKS has no backend {alias!r}")
    backend = task_backends[alias]
    if not isinstance(backend, AsyncqBackend):
        raise CommandError(
            f"TASKS[{alias!r}] is a {type(backend).__module__}.{type(backend).__qualname__},"
            " not asyncq.contrib.django.AsyncqBackend"
        )
    return backend


def configure_logging(verbosity: int) -> None:
    """asyncq's log lines on stderr, as the ``asyncq`` command prints them, unless
    Django's ``LOGGING`` sends them somewhere already: verbosity 0 warnings only, 1
    (the default) INFO, 2 and more DEBUG."""
    logger = logging.getLogger("asyncq")
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(
        logging.WARNING if verbosity == 0 else logging.DEBUG if verbosity > 1 else logging.INFO
    )


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``fn(*args)`` in an event loop (uvloop's, where it is installed)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(fn, *args)
    return anyio.run(fn, *args, backend_options={"use_uvloop": True})
