"""`asyncq.pools.Pace`: a call's deadline from what the calls of its kind usually take."""

from __future__ import annotations

import pytest

from asyncq.pools import FACTOR, FLOOR, LEARNED, WINDOW, Pace


def test_before_it_has_seen_enough_calls_the_deadline_is_the_ceiling_or_the_first() -> None:
    pace = Pace(10.0)
    for _ in range(LEARNED - 1):
        pace.took(0.001)
        assert pace.deadline == 10.0
    assert Pace(10.0, first=FLOOR).deadline == FLOOR
    assert Pace(1.0, first=FLOOR).deadline == 1.0  # never past the ceiling


def test_calls_of_milliseconds_are_given_the_floor() -> None:
    pace = Pace(10.0)
    for _ in range(LEARNED):
        pace.took(0.003)
    assert pace.deadline == FLOOR


def test_slow_calls_are_given_a_multiple_of_the_third_longest_up_to_the_ceiling() -> None:
    pace = Pace(10.0)
    for seconds in [0.1] * 50 + [0.9, 0.8, 0.7]:
        pace.took(seconds)
    assert pace.deadline == pytest.approx(FACTOR * 0.7)
    pace.took(3.0)  # a slower call counts at once
    assert pace.deadline == pytest.approx(FACTOR * 0.8)
    for _ in range(3):
        pace.took(5.0)
    assert pace.deadline == 10.0


def test_it_forgets_calls_older_than_its_window() -> None:
    pace = Pace(10.0)
    for seconds in [1.0] * 3 + [0.01] * (WINDOW - 3):
        pace.took(seconds)
    assert pace.deadline == FACTOR * 1.0
    for _ in range(3 + 16):  # a shorter deadline is worked out every few calls
        pace.took(0.01)
    assert pace.deadline == FLOOR


def test_a_cut_doubles_the_deadline_until_a_call_succeeds() -> None:
    pace = Pace(10.0)
    for _ in range(LEARNED):
        pace.took(0.003)
    deadlines = []
    for _ in range(4):
        pace.cut()
        deadlines.append(pace.deadline)
    assert deadlines == [2 * FLOOR, 4 * FLOOR, 10.0, 10.0]
    pace.took(0.003)
    assert pace.deadline == FLOOR


def test_the_floor_is_never_above_the_ceiling() -> None:
    pace = Pace(0.5)
    for _ in range(LEARNED):
        pace.took(0.001)
    assert pace.deadline == 0.5
