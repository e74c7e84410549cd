"""Limits are checked at declaration, and a group at defer, before anything is written."""

from __future__ import annotations

from typing import Any

import pytest

import asyncq
from asyncq.limits import ClaimLimits, Rate, TaskLimits, parse_rate

pytestmark = pytest.mark.anyio

UNOPENED = "postgresql://nobody@127.0.0.1:1/none"


async def job() -> None:
    pass


@pytest.mark.parametrize("value", [0, -1, 1.5, "3", True, 2**31])
@pytest.mark.parametrize("option", ["concurrency", "group_concurrency"])
def test_a_bad_count_is_refused_at_declaration(option: str, value: Any) -> None:
    app = asyncq.App(UNOPENED)
    with pytest.raises(asyncq.ConfigurationError, match=f"{option} must be a whole number"):
        app.task(**{option: value})(job)
    assert not app.tasks


@pytest.mark.parametrize(
    "value", ["fast", "0/s", "-1/s", "10/d", "10 /s", "10/ s", "1.5/s", "/s", "10", 10, "10/S"]
)
def test_a_bad_rate_limit_is_refused_at_declaration(value: Any) -> None:
    app = asyncq.App(UNOPENED)
    with pytest.raises(asyncq.ConfigurationError, match='rate_limit must be "N/s"'):
        app.task(rate_limit=value)(job)
    assert not app.tasks


def test_rates_are_read_per_second_minute_and_hour() -> None:
    assert parse_rate("1000/s") == Rate(1000, 1.0)
    assert parse_rate("30/m") == Rate(30, 60.0)
    assert parse_rate("5/h") == Rate(5, 3600.0)
    assert str(Rate(30, 60.0)) == "30/m"


def test_a_group_concurrency_above_the_task_concurrency_is_refused() -> None:
    app = asyncq.App(UNOPENED)
    with pytest.raises(asyncq.ConfigurationError, match="no group could ever reach it"):
        app.task(concurrency=2, group_concurrency=3)(job)
    app.task(concurrency=3, group_concurrency=3)(job)


@pytest.mark.parametrize("group", [5, b"acme", "", "nul\x00", "lone \ud800"])
async def test_a_bad_group_is_refused_before_anything_is_written(group: Any) -> None:
    app = asyncq.App(UNOPENED)
    task = app.task(group_concurrency=1)(job)
    with pytest.raises(ValueError, match="group must"):
        await task.options(group=group).defer()


def test_claim_limits_hold_only_the_limited_tasks() -> None:
    none = TaskLimits()
    assert ClaimLimits.of([("a", none), ("b", none)]) is None
    limits = ClaimLimits.of(
        [
            ("b", TaskLimits.declared(concurrency=5, rate_limit="7/m", group_concurrency=None)),
            ("c", none),
            ("a", TaskLimits.declared(concurrency=None, rate_limit=None, group_concurrency=2)),
        ]
    )
    assert limits == ClaimLimits(
        names=["a", "b"],
        concurrency=[None, 5],
        rate=[None, 7],
        period=[None, 60.0],
        group_concurrency=[2, None],
    )
