"""Limits of a task: how many of its jobs may run at once (in all, and per group) and how
many may start per period. Declared on ``@app.task``, checked here at declaration, and
enforced by the database when a worker claims (``claim_limited`` in ``sql/queries.sql``).
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from asyncq.errors import ConfigurationError

MAX_LIMIT = 2**31 - 1  # the limits travel as int4
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"([0-9]+)/([smh])")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` starts in any window of ``period`` seconds."""

    count: int
    period: float

    def __str__(self) -> str:
        unit = next(u for u, s in PERIODS.items() if s == self.period)
        return f"{self.count}/{unit}"


def parse_rate(value: object) -> Rate:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` with N >= 1, as a `Rate`; ConfigurationError if not."""
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    count = int(match[1]) if match else 0
    if match is None or not 1 <= count <= MAX_LIMIT:
        raise ConfigurationError(
            f'rate_limit must be "N/s", "N/m" or "N/h" with N a whole number from 1 to'
            f" {MAX_LIMIT} (at most N jobs start in any second, minute or hour), not {value!r}"
        )
    return Rate(count, PERIODS[match[2]])


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ConfigurationError(
            f"{name} must be a whole number from 1 to {MAX_LIMIT} (jobs at once), not {value!r}"
        )
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskLimits:
    """A task's limits; None means no such limit."""

    concurrency: int | None = None
    rate: Rate | None = None
    group_concurrency: int | None = None

    @classmethod
    def declared(
        cls, *, concurrency: object, rate_limit: object, group_concurrency: object
    ) -> TaskLimits:
        """The limits given to ``@app.task``, checked; ConfigurationError for a bad one."""
        limits = cls(
            concurrency=None if concurrency is None else _count(concurrency, "concurrency"),
            rate=None if rate_limit is None else parse_rate(rate_limit),
            group_concurrency=(
                None
                if group_concurrency is None
                else _count(group_concurrency, "group_concurrency")
            ),
        )
        if (
            limits.concurrency is not None
            and limits.group_concurrency is not None
            and limits.group_concurrency > limits.concurrency
        ):
            raise ConfigurationError(
                f"group_concurrency={limits.group_concurrency} is more than the task's"
                f" concurrency={limits.concurrency}: no group could ever reach it"
            )
        return limits

    def without_rate(self) -> TaskLimits:
        """These limits, but for the rate limit."""
        return TaskLimits(concurrency=self.concurrency, group_concurrency=self.group_concurrency)

    @property
    def any(self) -> bool:
        return (
            self.concurrency is not None
            or self.rate is not None
            or self.group_concurrency is not None
        )


NO_LIMITS = TaskLimits()


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """The limited tasks of a worker's App, as the limited claim takes them: one array per
    limit, one element per task (NULL where a task has no such limit)."""

    names: list[str]
    concurrency: list[int | None]
    rate: list[int | None]
    period: list[float | None]
    group_concurrency: list[int | None]

    @classmethod
    def of(
        cls, tasks: Iterable[tuple[str, TaskLimits]], fair: Iterable[str] = ()
    ) -> ClaimLimits | None:
        """The limits of the limited ones of ``tasks`` (name, limits), and of those named in
        ``fair`` (whose grouped jobs the limited claim takes by turns, limited or not);
        None if there are none."""
        fair = frozenset(fair)
        limited = sorted(
            ((name, lim) for name, lim in tasks if lim.any or name in fair), key=lambda t: t[0]
        )
        if not limited:
            return None
        return cls(
            names=[name for name, _ in limited],
            concurrency=[lim.concurrency for _, lim in limited],
            rate=[lim.rate.count if lim.rate else None for _, lim in limited],
            period=[lim.rate.period if lim.rate else None for _, lim in limited],
            group_concurrency=[lim.group_concurrency for _, lim in limited],
        )

    def params(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "period": self.period,
            "group_concurrency": self.group_concurrency,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Override:
    """Limits set at runtime (kept in the database) for a task or for every task of a
    queue; None keeps the limit below: a task's override over its queue's, a queue's
    over the code's."""

    kind: str  # "task" or "queue"
    name: str
    concurrency: int | None = None
    rate: Rate | None = None
    group_concurrency: int | None = None

    @classmethod
    def given(
        cls,
        kind: str,
        name: str,
        *,
        concurrency: object = None,
        rate_limit: object = None,
        group_concurrency: object = None,
    ) -> Override:
        """An override as `App.set_limits` takes it, checked; ConfigurationError for a bad
        limit (a concurrency of zero, a rate that does not parse), or for none at all."""
        if concurrency is None and rate_limit is None and group_concurrency is None:
            raise ConfigurationError(
                "set_limits needs at least one of concurrency, rate_limit and"
                " group_concurrency (reset_limits returns to the code's)"
            )
        return cls(
            kind=kind,
            name=name,
            concurrency=None if concurrency is None else _count(concurrency, "concurrency"),
            rate=None if rate_limit is None else parse_rate(rate_limit),
            group_concurrency=(
                None
                if group_concurrency is None
                else _count(group_concurrency, "group_concurrency")
            ),
        )

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Override:
        """A row of asyncq_limits (kind, name, concurrency, rate, period, group_concurrency)."""
        kind, name, concurrency, rate, period, group_concurrency = row[:6]
        return cls(
            kind=str(kind),
            name=str(name),
            concurrency=concurrency,
            rate=None if rate is None or period not in PERIODS.values() else Rate(rate, period),
            group_concurrency=group_concurrency,
        )


SOURCES = ("code", "queue", "task")
"""Where a limit in force comes from: the task's declaration, an override of its queue,
an override of the task itself (the later over the earlier)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sourced:
    """A task's limits in force, each with where it comes from (`SOURCES`; None where the
    task has no such limit)."""

    limits: TaskLimits
    concurrency: str | None
    rate: str | None
    group_concurrency: str | None


def in_force(
    code: TaskLimits, queue: Override | None = None, task: Override | None = None
) -> Sourced:
    """The limits in force for a task declaring ``code``, with the overrides of its queue
    and of itself: for each limit, the task's override, else the queue's, else the code's."""
    found: dict[str, tuple[Any, str | None]] = {}
    for field in ("concurrency", "rate", "group_concurrency"):
        value, source = getattr(code, field), "code" if getattr(code, field) is not None else None
        for over, name in ((queue, "queue"), (task, "task")):
            if over is not None and getattr(over, field) is not None:
                value, source = getattr(over, field), name
        found[field] = (value, source)
    return Sourced(
        limits=TaskLimits(
            concurrency=found["concurrency"][0],
            rate=found["rate"][0],
            group_concurrency=found["group_concurrency"][0],
        ),
        concurrency=found["concurrency"][1],
        rate=found["rate"][1],
        group_concurrency=found["group_concurrency"][1],
    )


def with_overrides(
    tasks: Iterable[tuple[str, str, TaskLimits]], overrides: Iterable[Override]
) -> list[tuple[str, Sourced]]:
    """Each of ``tasks`` (name, queue, limits in code) with its limits in force."""
    by_target = {(o.kind, o.name): o for o in overrides}
    return [
        (name, in_force(code, by_target.get(("queue", queue)), by_target.get(("task", name))))
        for name, queue, code in tasks
    ]


# Where a limit in force comes from, as the worker logs it and `asyncq limits` shows it.
SOURCE_NAMES = {"code": "code", "queue": "queue override", "task": "override"}


def describe(s: Sourced) -> str:
    """``s`` in a line: each limit with its source, as the worker logs them."""
    parts = [
        f"{label}={value} ({SOURCE_NAMES.get(source or '', source)})"
        for label, value, source in (
            ("concurrency", s.limits.concurrency, s.concurrency),
            ("rate_limit", s.limits.rate, s.rate),
            ("group_concurrency", s.limits.group_concurrency, s.group_concurrency),
        )
        if value is not None
    ]
    return ", ".join(parts) or "unlimited"
