"""Jobs ended per minute as stacked bars, laid out for an inline SVG (no script, no
stylesheet: the template draws rectangles at these coordinates)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

WIDTH = 720
HEIGHT = 160
AXIS = 20  # room under the bars for the time labels
COLOURS = {"done": "#3a7d44", "failed": "#c0392b", "cancelled": "#8e8e8e"}


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    fill: str
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    peak: int
    labels: list[tuple[float, str]]  # x, HH:MM


def throughput(rows: Sequence[tuple[datetime, str, int]], *, now: datetime, minutes: int) -> Chart:
    """``rows`` (minute, status, jobs) over the last ``minutes`` up to ``now``; the
    labels in UTC."""
    last = now.astimezone(UTC).replace(second=0, microsecond=0)
    slots = [last - timedelta(minutes=minutes - 1 - i) for i in range(minutes)]
    counts: dict[datetime, dict[str, int]] = {slot: {} for slot in slots}
    for minute, status, n in rows:
        if minute in counts:
            counts[minute][status] = counts[minute].get(status, 0) + n
    peak = max((sum(c.values()) for c in counts.values()), default=0)
    plot = HEIGHT - AXIS
    step = WIDTH / minutes
    bars = []
    labels = []
    for i, slot in enumerate(slots):
        y = float(plot)
        for status in ("done", "failed", "cancelled"):
            n = counts[slot].get(status, 0)
            if not n:
                continue
            height = plot * n / peak
            y -= height
            bars.append(
                Bar(
                    x=round(i * step + 1, 1),
                    y=round(y, 1),
                    width=round(max(step - 2, 1), 1),
                    height=round(height, 1),
                    fill=COLOURS[status],
                    title=f"{slot:%H:%M} {status}: {n}",
                )
            )
        if i % 10 == 0:
            labels.append((round(i * step + 1, 1), f"{slot:%H:%M}"))
    return Chart(width=WIDTH, height=HEIGHT, bars=bars, peak=peak, labels=labels)
