"""The jobs list's filters: read from a query string or a form, checked, and written back
into links and forms (the pages, the tabs, a bulk action's preview)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from asyncq import admin

PAGE = 50
MAX_PAGE = 200  # 10,000 jobs deep: past that, a narrower filter finds it sooner
COUNTED = PAGE * MAX_PAGE
WINDOWS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
# The fields of a filter, as named in query strings and forms.
FIELDS = ("id", "status", "queue", "task", "worker", "window", "from", "to", "text", "up_to")


class BadFilter(ValueError):
    """A filter's value the dashboard refuses (400)."""


@dataclass(frozen=True, slots=True)
class Filter:
    """A filter as given (``given``: its non-empty fields as text, to write back into
    links and forms) and as checked (``where``)."""

    given: dict[str, str]
    where: admin.JobFilter

    def query(self, **more: object) -> str:
        """A query string of this filter, with ``more`` fields (None: left out)."""
        fields = {**self.given, **{k: str(v) for k, v in more.items() if v is not None}}
        return urlencode({k: v for k, v in fields.items() if v})

    def without(self, *names: str) -> dict[str, str]:
        return {k: v for k, v in self.given.items() if k not in names}

    def fixed(self, now: datetime, up_to: int | None) -> dict[str, str]:
        """The filter as a bulk action's confirmation carries it: a relative window made
        an absolute start (the jobs the preview counted, not those of a later window),
        and the highest id it counted."""
        fixed = self.without("window")
        if "window" in self.given and "from" not in fixed:
            fixed["from"] = (now - WINDOWS[self.given["window"]]).isoformat()
        if up_to is not None:
            fixed["up_to"] = str(up_to)
        return fixed


def read(values: Mapping[str, str], *, now: datetime) -> Filter:
    """The filter that ``values`` (a query string, a form) give; `BadFilter` names the
    value refused."""
    given = {k: values[k].strip() for k in FIELDS if values.get(k, "").strip()}
    since = _moment(given.get("from"), "from")
    window = given.get("window")
    if window is not None:
        if window not in WINDOWS:
            raise BadFilter(f"the window is one of {', '.join(WINDOWS)}")
        start = now - WINDOWS[window]
        since = start if since is None else max(since, start)
    try:
        where = admin.JobFilter(
            id=_whole(given.get("id"), "id"),
            status=given.get("status"),
            queue=given.get("queue"),
            task=given.get("task"),
            worker=given.get("worker"),
            since=since,
            until=_moment(given.get("to"), "to"),
            text=given.get("text"),
            up_to=_whole(given.get("up_to"), "up_to"),
        )
    except (TypeError, ValueError) as refused:
        raise BadFilter(str(refused)) from None
    return Filter(given, where)


def page_number(text: str | None) -> int:
    page = _whole(text, "page")
    if page is None:
        return 1
    if not 1 <= page <= MAX_PAGE:
        raise BadFilter(f"the page is from 1 to {MAX_PAGE}")
    return page


def _whole(text: str | None, what: str) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or len(text) > 19 or int(text) == 0 or int(text) >= 2**63:
        raise BadFilter(f"{what} is a whole number from 1")
    return int(text)


def _moment(text: str | None, what: str) -> datetime | None:
    """A time as ISO 8601 (a date alone, a date and time; without a zone: UTC)."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadFilter(f"{what} is a date and time (ISO 8601: 2026-01-31 14:00)") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
