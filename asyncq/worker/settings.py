"""A worker's settings: each option's default, bounds and help, written once.

`WorkerSettings` validates them. ``asyncq worker``'s options (`add_arguments`,
`from_arguments`) and ``App.run_worker``'s keyword arguments (`WorkerOptions`) are
derived from its fields, so the three cannot disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, TypedDict

from asyncq.codec import validate_name
from asyncq.errors import ConfigurationError
from asyncq.job import PRIORITY_AGING

# A job handed back at shutdown does not count its attempt this many times; after that,
# each hand-back counts (docs/explanation/workers.md, "Signals and grace").
FREE_HANDBACKS = 3
# After the grace period, how long stopped jobs have to end before the worker leaves
# those that do not (a task that swallows cancellation) to their lease.
STOP_DEADLINE = 5.0
# The self-fence: a worker stops an attempt whose lease it has not renewed for this share
# of the lease, counted on its own monotonic clock from when it sent the last renewal that
# succeeded (or the claim). The database wrote the row's lock no earlier than that send, so
# no rescuer can take the job back before a whole lease after it: stopping at 0.8 of the
# lease leaves a fifth of it (6 s of the default 30 s) for the task to unwind after its
# cancellation, for the loop's lag and for the two clocks to tick at slightly different
# rates. Renewals are sent every quarter of the lease and cut at a quarter: after one
# that hangs to its deadline, the next is sent three quarters of a lease after the last
# success, and saves the attempt if it is answered within a twentieth of the lease.
FENCE_AFTER = 0.8


@dataclass(frozen=True, slots=True)
class Option:
    """How one setting is given: its check, and its command-line form (if it has one)."""

    check: Callable[[Any, str], Any]
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    help: str = ""


def _int(low: int, high: int) -> Callable[[Any, str], int]:
    def check(value: Any, name: str) -> int:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigurationError(
                f"{name} must be a whole number from {low} to {high}, not {value!r}"
            )
        return value

    return check


def _seconds(low: float, high: float, *, above: bool = False) -> Callable[[Any, str], float]:
    def check(value: Any, name: str) -> float:
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        ok = (
            isinstance(number, int | float)
            and not isinstance(number, bool)
            and math.isfinite(number)
            and (low < number if above else low <= number)
            and number <= high
        )
        if not ok:
            bound = "more than" if above else "from"
            raise ConfigurationError(
                f"{name} must be a number of seconds {bound} {low:g} to {high:g}, not {value!r}"
            )
        return float(number)

    return check


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, not {value!r}")
    return value


def _queues(value: Any, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]  # one queue name, not a sequence of one-letter names
    queues = tuple(value)
    for queue in queues:
        validate_name("queue", queue)
    return queues or None


def _batch_size(value: Any, name: str) -> int | None:
    return None if value is None else _int(1, 10_000)(value, name)


def _threads(value: Any, name: str) -> int | None:
    return None if value is None else _int(1, 10_000)(value, name)


def _port(value: Any, name: str) -> int | None:
    return None if value is None else _int(1, 65_535)(value, name)


CAPTURE_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "off")


def _capture_level(value: Any, name: str) -> str:
    text = value.strip() if isinstance(value, str) else value
    for level in CAPTURE_LEVELS:
        if isinstance(text, str) and text.lower() == level.lower():
            return level
    raise ConfigurationError(f"{name} must be one of {', '.join(CAPTURE_LEVELS)}, not {value!r}")


def _host(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise ConfigurationError(f"{name} must be a host name or address, not {value!r}")
    return value


def option(default: Any, check: Callable[[Any, str], Any], *flags: str, **how: Any) -> Any:
    return field(default=default, metadata={"option": Option(check, flags, **how)})


DAY = 86_400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSettings:
    """Everything a worker is told. Options with flags are ``asyncq worker``'s."""

    queues: tuple[str, ...] | None = option(
        None,
        _queues,
        "-q",
        "--queue",
        metavar="Q",
        help="serve this queue (repeat for several; default: every queue)",
    )
    concurrency: int = option(
        10, _int(1, 100_000), "-c", "--concurrency", metavar="N", help="jobs run at once"
    )
    threads: int | None = option(
        None,
        _threads,
        "--threads",
        metavar="N",
        help="threads for tasks that are plain def functions (default: the concurrency)",
    )
    batch_size: int | None = option(
        None,
        _batch_size,
        "--batch-size",
        metavar="N",
        help="most jobs claimed by one query (default: the concurrency plus the prefetch,"
        " at most 100)",
    )
    prefetch: int = option(
        400,
        _int(0, 10_000),
        "--prefetch",
        metavar="N",
        help="most jobs claimed beyond the concurrency while jobs are short, to wait for a"
        " free slot: as many as the worker runs in 20 ms (0: never)",
    )
    lease: float = option(
        30.0,
        _seconds(0.5, 7 * DAY),
        "--lease",
        metavar="SECONDS",
        help="how long a claimed job stays this worker's without a heartbeat",
    )
    grace: float = option(
        20.0,
        _seconds(0, DAY),
        "--grace",
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long running jobs may finish before they are handed back",
    )
    poll_interval: float = option(
        1.0,
        _seconds(0.05, DAY),
        "--poll-interval",
        metavar="SECONDS",
        help="look for ready jobs at least this often, notifications or not",
    )
    unknown_task_grace: float = option(
        600.0,
        _seconds(0, 30 * DAY),
        "--unknown-task-grace",
        metavar="SECONDS",
        help="a job whose task this worker does not know is given back (the attempt does not"
        " count) for a worker that knows it; it fails once no worker has taken it this long"
        " after the first gave it back",
    )
    priority_aging: float = option(
        PRIORITY_AGING,
        _seconds(0, DAY),
        "--priority-aging",
        metavar="SECONDS",
        help="a queued job's priority rises one level for every this long it waits, so that"
        " a stream of higher priorities never starves it; 0 turns it off",
    )
    listener_health_interval: float = option(
        10.0,
        _seconds(0.1, DAY),
        "--listener-health-interval",
        metavar="SECONDS",
        help="advanced: check the LISTEN connection after this long without a notification",
    )
    listener_health_timeout: float = option(
        5.0,
        _seconds(0.1, 3600),
        "--listener-health-timeout",
        metavar="SECONDS",
        help="advanced: reconnect when that check gets no answer within this long (at most:"
        " sooner once its usual round trip is known)",
    )
    metrics_port: int | None = option(
        None,
        _port,
        "--metrics-port",
        metavar="PORT",
        help="serve Prometheus metrics at /metrics on this port (needs asyncq[metrics])",
    )
    metrics_host: str = option(
        "127.0.0.1",
        _host,
        "--metrics-host",
        metavar="HOST",
        help="the address the metrics are served on",
    )
    log_capture: str = option(
        "INFO",
        _capture_level,
        "--log-capture",
        metavar="LEVEL",
        help="keep what a task logs at this level or above (as far as the logging"
        " configuration lets it through) with its attempt; off: keep nothing",
    )
    drain: bool = option(
        False,
        _flag,
        "--drain",
        help="exit once no job is ready and none is running (for scripts and tests)",
    )
    handle_signals: bool = option(True, _flag)
    # Not options: the App's retention, and maintenance intervals.
    retention: timedelta = timedelta(days=7)
    rescue_interval: float = 2.0
    wakeups_interval: float = 10.0
    unknown_interval: float = 30.0
    prune_interval: float = 60.0
    # How often each queue's jobs are counted, for the metrics and the queue samples (a
    # minute's sample is whole once counted after its end), and how long samples are kept.
    samples_interval: float = 15.0
    samples_retention: timedelta = timedelta(days=7)
    presence_interval: float = 5.0  # how often the worker's row in asyncq_workers is refreshed
    workers_interval: float = 60.0  # the maintenance's look for rows of workers that died
    app_path: str | None = None  # MODULE:APP, as `asyncq worker` was given it

    def __post_init__(self) -> None:
        for f in fields(self):
            spec: Option | None = f.metadata.get("option")
            if spec is not None:
                object.__setattr__(self, f.name, spec.check(getattr(self, f.name), f.name))
        if self.batch_size is None:
            object.__setattr__(self, "batch_size", min(self.concurrency + self.prefetch, 100))
        if self.threads is None:
            object.__setattr__(self, "threads", min(self.concurrency, 10_000))

    @property
    def batch(self) -> int:
        assert self.batch_size is not None
        return self.batch_size


class WorkerOptions(TypedDict, total=False):
    """``App.run_worker``'s keyword arguments: the options of `WorkerSettings`."""

    concurrency: int
    threads: int | None
    batch_size: int | None
    prefetch: int
    lease: float
    grace: float
    poll_interval: float
    unknown_task_grace: float
    priority_aging: float
    listener_health_interval: float
    listener_health_timeout: float
    metrics_port: int | None
    metrics_host: str
    log_capture: str
    drain: bool
    handle_signals: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``asyncq worker``'s options, one per setting with flags. Values are checked by
    `from_arguments`, so that a bad one is a one-line error naming its flag."""
    for f in fields(WorkerSettings):
        spec: Option | None = f.metadata.get("option")
        if spec is None or not spec.flags:
            continue
        help_text = spec.help
        if isinstance(f.default, str):
            help_text += f" (default: {f.default})"
        elif f.default not in (None, False):
            help_text += f" (default: {f.default:g})"
        if f.name == "queues":
            parser.add_argument(
                *spec.flags, dest=f.name, action="append", metavar=spec.metavar, help=help_text
            )
        elif spec.check is _flag:
            parser.add_argument(
                *spec.flags, dest=f.name, action="store_true", default=None, help=help_text
            )
        else:
            parser.add_argument(*spec.flags, dest=f.name, metavar=spec.metavar, help=help_text)


def from_arguments(args: argparse.Namespace) -> tuple[tuple[str, ...] | None, dict[str, Any]]:
    """The queues and the other options given to ``asyncq worker``, checked; a bad value
    is a `ConfigurationError` that names its flag."""
    given: dict[str, Any] = {}
    for f in fields(WorkerSettings):
        spec: Option | None = f.metadata.get("option")
        value = getattr(args, f.name, None)
        if spec is None or not spec.flags or value is None:
            continue
        given[f.name] = spec.check(value, spec.flags[-1])
    queues = given.pop("queues", None)
    WorkerSettings(queues=queues, **given)
    return queues, given


def from_options(queues: Sequence[str] | str | None, **options: Any) -> WorkerSettings:
    """The settings from ``App.run_worker``'s arguments."""
    known = {f.name for f in fields(WorkerSettings)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown worker options: {', '.join(unknown)}")
    return WorkerSettings(queues=queues, **options)  # type: ignore[arg-type]
