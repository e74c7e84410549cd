"""Text for a terminal: tables, sizes, ages and times, as the ``asyncq`` command prints
them (``--json`` prints the records themselves)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

MAX_CELL = 60


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers to the right; long cells cut short.
    Headers are lower case, in every table the command prints."""
    headers = [h.lower() for h in headers]
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]
    lines = []
    for row in [list(headers), *cells]:
        parts = [
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def shown(shown: int, total: int, *, more: bool = False) -> str:
    """What a listing cut short says of itself: ``20 of 57 shown``, or with ``more``
    (``total`` is where counting stopped) ``20 of 1,000+ shown``."""
    return f"{shown:,} of {total:,}{'+' if more else ''} shown"


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    text = printable(" ".join(str(value).split()))
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def printable(text: str) -> str:
    """``text`` with control characters escaped: a task name or an error is input from
    anyone who can defer, and must not move the cursor or recolour the terminal."""
    return "".join(c if c.isprintable() or c in "\n" else repr(c)[1:-1] for c in text)


def size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB"):
        value /= 1024
        if value < 1024 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m {seconds % 60}s"
    if seconds < 172800:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def duration(seconds: float | None) -> str:
    """A step's length: milliseconds under a second, then seconds, then as `age`."""
    if seconds is None:
        return "-"
    if seconds <= 0:
        return "0ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return age(seconds)


def since(then: datetime | None, now: datetime) -> str:
    return "never" if then is None else f"{age((now - then).total_seconds())} ago"
