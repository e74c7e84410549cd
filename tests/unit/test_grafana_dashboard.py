"""docs/grafana/asyncq.json asks only for metrics asyncq exports, with their labels and
outcome names as they are."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from asyncq.metrics import _OUTCOMES, WorkerMetrics

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "asyncq.json"
# What the dashboard app's /metrics adds (asyncq/dashboard/metrics.py).
DASHBOARD_APP_SERIES = {"asyncq_queue_jobs", "asyncq_queue_paused"}


def exported_series() -> set[str]:
    """Every series name a worker exports (series with labels have no samples until
    used: they are named from their family and type)."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    return {
        family.name + suffix
        for family in WorkerMetrics().registry.collect()
        for suffix in suffixes.get(family.type, [""])
    }


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def test_every_metric_the_dashboard_asks_for_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_series() | DASHBOARD_APP_SERIES
    asked = {name for expr in expressions(dashboard) for name in re.findall(r"asyncq_\w+", expr)}
    assert asked, "the dashboard asks for nothing"
    assert asked <= exported, asked - exported


def test_the_outcomes_it_filters_on_are_asyncqs() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for expr in expressions(dashboard):
        for matcher in re.findall(r'outcome=~"([^"]+)"', expr):
            assert set(matcher.split("|")) <= set(_OUTCOMES.values()), expr
