"""River's pickup, read as the benchmark harness reads river-pickup's output (no database:
the figures are made up, only their parsing and arithmetic are checked)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import report
from benchmarks.river import DEFAULTS, PICKUP_SETTINGS, SETTINGS, pickup_result


def _lines(call_ms: list[float], commit_gap: float = 1.0) -> list[str]:
    settings = {"settings": True, "fetch_cooldown_ms": 100.0, "fetch_poll_interval_ms": 1000.0}
    rows = [
        {"seq": 5 + i, "from_call_ms": v, "from_commit_ms": v - commit_gap}
        for i, v in enumerate(call_ms)
    ]
    return [json.dumps(settings), *(json.dumps(r) for r in rows)]


def test_pickup_result_percentiles_from_the_samples() -> None:
    # 1..10 ms and one job that waited for the poll: linear between closest ranks
    samples = [float(v) for v in range(1, 11)] + [900.0]
    found = pickup_result(["river-pickup: a stray line", *_lines(samples)])
    assert found["n"] == 11
    assert found["p50_ms"] == pytest.approx(6.0)
    assert found["p95_ms"] == pytest.approx(10 + (900 - 10) * 0.5)
    assert found["commit_p50_ms"] == pytest.approx(5.0)
    assert found["max_ms"] == 900.0
    assert found["mean_ms"] == pytest.approx((55 + 900) / 11)
    assert (found["fetch_cooldown_ms"], found["fetch_poll_interval_ms"]) == (100.0, 1000.0)


def test_pickup_result_without_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        pickup_result(_lines([]))


def _run(setting: str, p50: float, p95: float, **extra: Any) -> dict[str, Any]:
    cooldown, poll = (100.0, 1000.0) if setting == "defaults" else (2.0, 20.0)
    return {
        "setting": setting,
        "p50_ms": p50,
        "p95_ms": p95,
        "fetch_cooldown_ms": cooldown,
        "fetch_poll_interval_ms": poll,
        **extra,
    }


def test_river_pickup_medians_per_setting_in_the_report() -> None:
    runs = [
        _run("defaults", 80.0, 950.0),
        _run("defaults", 90.0, 900.0),
        _run("defaults", 85.0, 990.0),
        _run("tuned", 3.0, 5.0),
        {"setting": "tuned", "error": "river-pickup exited 1"},  # counts for nothing
    ]
    summary = report.river_pickup_summary({"river_pickup": runs})
    assert summary["defaults"]["p50_ms"] == 85.0
    assert summary["defaults"]["p95_ms"] == 950.0
    assert (summary["defaults"]["runs"], summary["tuned"]["runs"]) == (3, 1)
    meta = {
        "version": "v0.43.0 (60435dc2c58e)",
        "settings": SETTINGS,
        "defaults": DEFAULTS,
        "pickup_settings": PICKUP_SETTINGS,
    }
    text = report.render_river({"river_meta": meta, "river_pickup": runs})
    assert "FetchCooldown 100 ms, FetchPollInterval 1000 ms" in text
    assert "950.00" in text and "not measured" not in text
    assert "not measured" in report.render_river({"river_meta": meta})
