"""The start-states report and River's bench output, read as the benchmark harness reads them
(no database: the figures are made up, only their arithmetic is checked)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import report
from benchmarks.river import SUMMARY, go_duration, url_of


def _run(system: str, state: str, rate: float, concurrency: int = 10) -> dict[str, Any]:
    point = {"concurrency": concurrency, "batch": 0, "processes": 1, "variant": ""}
    return {"system": system, "state": state, "rate": rate, "ok": True, "point": point}


def test_starts_summary_worst_state_and_lowest_ratios() -> None:
    runs = [
        # asyncq: medians empty 50, warm 90 (of 80, 90, 100)
        _run("asyncq", "empty", 50.0),
        *(_run("asyncq", "warm", r) for r in (80.0, 100.0, 90.0)),
        _run("sql", "empty", 100.0),
        _run("sql", "warm", 100.0),
        _run("river", "empty", 200.0),
        _run("river", "warm", 60.0),
        {**_run("asyncq", "warm", 1.0), "ok": False},  # a failed drain counts for nothing
    ]
    rows = {row["system"]: row for row in report.starts_summary({"starts": runs})}
    asyncq = rows["asyncq"]
    assert asyncq["rates"] == {"empty": 50.0, "warm": 90.0}
    assert (asyncq["worst_state"], asyncq["worst"]) == ("empty", 50.0)
    assert asyncq["vs_sql"] == pytest.approx(0.5)
    assert asyncq["vs_river"] == pytest.approx(0.25)  # 50 / 200 in the empty state
    assert rows["sql"]["vs_sql"] is None
    assert rows["river"]["vs_river"] is None
    assert rows["river"]["worst_state"] == "warm"
    text = report.render_starts({"starts": runs, "meta": {"starts": {"burst": 20}}})
    assert "50 (empty)" in text and "0.25x" in text


def test_river_summary_line_and_durations() -> None:
    line = (
        "bench: total jobs worked [      20000 ], total jobs inserted [      20000 ],"
        " overall job/sec [    31234.5 ], running 640.3ms"
    )
    ((worked, inserted, rate, running),) = SUMMARY.findall(line)
    assert (worked, inserted, rate) == ("20000", "20000", "31234.5")
    assert go_duration(running) == pytest.approx(0.6403)
    assert go_duration("1m2.5s") == pytest.approx(62.5)
    with pytest.raises(ValueError):
        go_duration("soon")


def test_river_url_of_a_libpq_dsn() -> None:
    dsn = "user=postgres password=p@ss dbname=asyncq_bench_river host=127.0.0.1 port=5433"
    assert url_of(dsn) == "postgres://postgres:p%40ss@127.0.0.1:5433/asyncq_bench_river"
