"""The group limits benchmark's arithmetic (no database: the samples are made up, only what
is counted from them is checked)."""

from __future__ import annotations

import pytest

from benchmarks.group_limits import GroupFigure, Sample, figures, over_rounds, reaped_at

LIMITS = {"A": 25, "C": 1}


def sample(
    at: float,
    running: dict[str, int],
    queued: dict[str, int],
    dead: dict[str, int] | None = None,
) -> Sample:
    return Sample(at=at, running=running, dead=dead or {}, queued=queued)


def test_figures_count_from_a_group_s_first_job_while_it_has_a_backlog() -> None:
    samples = [
        sample(0.0, {"A": 0, "C": 0}, {"A": 100, "C": 10}),  # warm-up: nothing started yet
        sample(0.1, {"A": 20, "C": 0}, {"A": 80, "C": 10}),  # C not started yet
        sample(0.2, {"A": 25, "C": 1}, {"A": 55, "C": 9}),
        sample(0.3, {"A": 25, "C": 1}, {"A": 30, "C": 8}),
        sample(0.4, {"A": 10, "C": 1}, {"A": 0, "C": 7}),  # A's backlog is gone
    ]
    figs = figures(samples, LIMITS)
    a, c = figs["A"], figs["C"]
    assert (a.max, a.median, a.samples) == (25, 25, 3)  # 20, 25, 25
    assert a.mean == pytest.approx(70 / 3)
    assert a.started_per_s == pytest.approx((80 - 30) / 0.2)
    assert (c.max, c.median, c.samples) == (1, 1, 3)
    assert c.started_per_s == pytest.approx((9 - 7) / 0.2)


def test_figures_count_only_live_workers_jobs_after_since() -> None:
    samples = [
        sample(0.0, {"A": 25, "C": 1}, {"A": 50, "C": 50}),
        sample(0.1, {"A": 25, "C": 1}, {"A": 50, "C": 50}, dead={"A": 12, "C": 1}),
        sample(0.2, {"A": 20, "C": 1}, {"A": 40, "C": 49}),
        sample(0.3, {"A": 24, "C": 0}, {"A": 30, "C": 49}),
    ]
    figs = figures(samples, LIMITS, since=0.1)
    assert (figs["A"].max, figs["A"].median) == (24, 20)  # 13 live, 20, 24
    assert (figs["C"].max, figs["C"].median) == (1, 0)  # 0 live, 1, 0
    assert figs["A"].mean == pytest.approx(57 / 3)


def test_reaped_at_is_the_first_sample_after_the_dead_worker_s_last_job() -> None:
    samples = [
        sample(0.0, {"A": 25}, {"A": 9}),
        sample(0.1, {"A": 25}, {"A": 9}, dead={"A": 12}),  # the kill
        sample(0.2, {"A": 25}, {"A": 9}, dead={"A": 12}),
        sample(0.3, {"A": 13}, {"A": 21}, dead={"A": 0}),  # put back
        sample(0.4, {"A": 25}, {"A": 9}),
    ]
    assert reaped_at(samples, 0.1) == 0.3
    assert reaped_at(samples[:3], 0.1) is None  # still held at the end
    held_none = [sample(0.0, {"A": 0}, {"A": 9}), sample(0.1, {"A": 0}, {"A": 9})]
    assert reaped_at(held_none, 0.05) == 0.1


def test_over_rounds_takes_the_highest_max_and_the_median_of_medians() -> None:
    rounds = [
        {"A": GroupFigure(25, max=24, median=20.0, mean=9.0, samples=10, started_per_s=100.0)},
        {"A": GroupFigure(25, max=25, median=25.0, mean=7.0, samples=10, started_per_s=300.0)},
        {"A": GroupFigure(25, max=23, median=22.0, mean=8.0, samples=5, started_per_s=200.0)},
    ]
    a = over_rounds(rounds)["A"]
    assert (a.limit, a.max, a.median, a.mean) == (25, 25, 22.0, 8.0)
    assert (a.samples, a.started_per_s) == (25, 200.0)
