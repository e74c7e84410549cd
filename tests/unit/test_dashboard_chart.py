"""The queues page's small lines: scaled to their peak, broken where a minute has no
value, a value alone drawn as a dot."""

from __future__ import annotations

import pytest

pytest.importorskip("jinja2", reason="the dashboard extra is not installed")

from asyncq.dashboard import chart


def test_a_line_is_scaled_to_its_peak_and_broken_at_gaps() -> None:
    drawn = chart.spark("ready", [0, 2, 4, None, 1, None, None, 3])
    assert drawn.peak == "4" and drawn.last == "3"
    assert len(drawn.segments) == 1  # 0, 2, 4; then 1 and 3 alone
    first = [tuple(float(n) for n in p.split(",")) for p in drawn.segments[0].split()]
    assert first[0] == (chart.SPARK_INSET, chart.SPARK_HEIGHT - chart.SPARK_INSET)  # zero
    assert first[2][1] == chart.SPARK_INSET  # the peak at the top
    assert len(drawn.dots) == 2
    assert float(drawn.dots[-1][0]) == chart.SPARK_WIDTH - chart.SPARK_INSET  # now: the right


def test_waits_read_in_seconds_or_minutes_and_nothing_is_a_dash() -> None:
    assert chart.spark("wait", [None, 40.0, 1500.0], seconds=True).peak == "25m"
    assert chart.spark("wait", [2.25, None], seconds=True).last == "-"
    assert chart.spark("ready", []).segments == []
