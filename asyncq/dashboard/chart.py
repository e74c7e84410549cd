"""Charts laid out for inline SVG (no script, no stylesheet: the templates draw shapes at
these coordinates): jobs ended per minute as stacked bars, and each queue's ready jobs,
jobs done and wait over a window (an hour, a day, a week) as small lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from asyncq.admin import QueueHistory

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


# -- a queue over a window: three small line charts ------------------------------------

SPARK_WIDTH = 180
SPARK_HEIGHT = 36
SPARK_INSET = 3  # room at the edges for a dot


@dataclass(frozen=True, slots=True)
class Spark:
    """One series as polylines in a ``SPARK_WIDTH`` by ``SPARK_HEIGHT`` box: each of
    ``segments`` for a ``points`` attribute (a minute without a value ends a segment; a
    value alone is one of ``dots``), its ``peak`` and its ``last`` value, as text."""

    what: str
    segments: list[str]
    dots: list[tuple[str, str]]  # x, y of a value alone between gaps (no line to draw)
    peak: str
    last: str
    title: str


@dataclass(frozen=True, slots=True)
class Trends:
    """A queue's depth, jobs done and wait, over its history's minutes."""

    minutes: int
    depth: Spark
    rate: Spark
    wait: Spark


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _seconds(value: float) -> str:
    if value < 60:
        return f"{value:.1f}s" if value < 10 else f"{value:.0f}s"
    return f"{value / 60:.1f}m" if value < 600 else f"{value / 60:.0f}m"


def spark(
    what: str, values: Sequence[float | None], *, unit: str = "", seconds: bool = False
) -> Spark:
    """``values``, one per minute (None: no value that minute), as a line from the left
    edge (the oldest) to the right (now), scaled to the series' peak."""
    shown = _seconds if seconds else _number
    present = [v for v in values if v is not None]
    peak = max(present, default=0.0)
    step = (SPARK_WIDTH - 2 * SPARK_INSET) / max(len(values) - 1, 1)
    runs: list[list[tuple[str, str]]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            runs.append([])
            continue
        rise = (SPARK_HEIGHT - 2 * SPARK_INSET) * (value / peak if peak else 0.0)
        runs[-1].append(
            (f"{SPARK_INSET + i * step:.1f}", f"{SPARK_HEIGHT - SPARK_INSET - rise:.1f}")
        )
    segments = [" ".join(f"{x},{y}" for x, y in run) for run in runs if len(run) > 1]
    dots = [run[0] for run in runs if len(run) == 1]
    last = values[-1] if values else None
    last_text = "-" if last is None else shown(last) + unit
    peak_text = shown(peak) + unit
    return Spark(
        what=what,
        segments=segments,
        dots=dots,
        peak=peak_text,
        last=last_text,
        title=f"{what}: now {last_text}, peak {peak_text}",
    )


def trends(history: QueueHistory) -> Trends:
    """A queue's history as three lines: ready jobs at the end of each span of
    ``history.per`` minutes, jobs done in each, the longest wait (due to start) of the
    jobs claimed in each."""
    return Trends(
        minutes=history.minutes,
        depth=spark("ready", history.depth),
        rate=spark(f"done/{_span(history.per)}", history.done),
        wait=spark("longest wait", history.wait_max, seconds=True),
    )


def _span(minutes: int) -> str:
    if minutes == 1:
        return "min"
    return "h" if minutes == 60 else f"{minutes} min"
