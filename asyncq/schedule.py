"""Schedules: cron expressions, their slots, and what a declared schedule holds. Pure:
no I/O.

A slot is a moment a cron expression names, in its time zone, as an aware UTC
datetime. Expressions are the standard five fields (minute, hour, day of month, month,
day of week) or an alias (``@hourly``, ``@daily``, ...); cronsim reads them, with
Debian cron's handling of daylight-saving changes for jobs at a fixed time of day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_SECOND = timedelta(seconds=1)


def zone(name: object) -> tzinfo:
    """The time zone named ``name`` (an IANA name such as ``Europe/Paris``, or ``UTC``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"tz must be an IANA time zone name such as 'Europe/Paris', not {name!r}")
    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None


class Cron:
    """A cron expression in a time zone; `ValueError` if either is not valid."""

    def __init__(self, expression: str, tz: str = "UTC") -> None:
        if not isinstance(expression, str):
            raise TypeError(f"cron must be a string, not {expression!r}")
        self.expression = expression
        self.tz_name = tz
        self.tz = zone(tz)
        fields = ALIASES.get(expression.strip().lower(), expression)
        if len(fields.split()) != 5:
            raise ValueError(
                f"bad cron expression {expression!r}: expected five fields (minute hour"
                f" day-of-month month day-of-week) or one of {', '.join(ALIASES)}"
            )
        self.fields = fields
        try:
            CronSim(fields, datetime.now(self.tz))
            self.next_after(datetime.now(UTC))
        except (CronSimError, StopIteration) as exc:
            detail = f": {exc}" if str(exc) else ""
            raise ValueError(f"bad cron expression {expression!r}{detail}") from None

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, tz={self.tz_name!r})"

    def next_after(self, at: datetime) -> datetime:
        """The first slot later than ``at`` (an aware datetime)."""
        return next(CronSim(self.fields, at.astimezone(self.tz))).astimezone(UTC)

    def latest(self, at: datetime) -> datetime:
        """The latest slot at or before ``at`` (an aware datetime)."""
        # Reverse iteration yields slots before its start: start one second after ``at``,
        # in whole seconds (slots are whole minutes), so that ``at`` itself may be a slot.
        start = (at.replace(microsecond=0) + _SECOND).astimezone(self.tz)
        return next(CronSim(self.fields, start, reverse=True)).astimezone(UTC)


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A declared schedule: each slot of ``cron`` makes one job of ``task_name`` with
    ``args`` (a JSON object, already checked against the task's function)."""

    name: str
    cron: Cron
    task_name: str
    queue: str
    args: str
    priority: int
    max_attempts: int

    @property
    def tz(self) -> str:
        """The IANA time zone name the cron expression is read in."""
        return self.cron.tz_name
