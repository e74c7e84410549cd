"""Backoff: exponential, capped, jittered, never shorter than its base."""

from __future__ import annotations

import random

import pytest

import asyncq


@pytest.mark.parametrize(
    "backoff",
    [
        asyncq.Backoff(),
        asyncq.Backoff(base=0.05, cap=0.1),
        asyncq.Backoff(base=2, factor=3, cap=100, jitter=1),
        asyncq.Backoff(base=1, cap=1, jitter=0),
    ],
    ids=repr,
)
def test_delays_are_at_least_base_and_at_most_the_jittered_cap(backoff: asyncq.Backoff) -> None:
    rng = random.Random(1234)
    for attempt in [*range(1, 40), 100, 10_000, 10**9]:
        for _ in range(20):
            delay = backoff.delay(attempt, rng)
            assert backoff.base <= delay <= backoff.cap * (1 + backoff.jitter)


def test_default_never_retries_within_a_second() -> None:
    backoff = asyncq.Backoff()
    rng = random.Random(7)
    assert min(backoff.delay(1, rng) for _ in range(1000)) >= 1.0
    assert asyncq.Backoff().delay(1) >= 1.0


def test_delays_grow_exponentially_up_to_the_cap() -> None:
    backoff = asyncq.Backoff(base=1, factor=2, cap=10, jitter=0)
    assert [backoff.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff.delay(10**6) == 10  # no overflow for huge attempt numbers


def test_jitter_spreads_delays_within_its_fraction() -> None:
    backoff = asyncq.Backoff(base=1, factor=2, cap=1000, jitter=0.5)
    rng = random.Random(99)
    delays = [backoff.delay(3, rng) for _ in range(500)]
    assert len(set(delays)) > 400  # jittered: jobs that failed together come back apart
    assert min(delays) >= 4.0 and max(delays) <= 6.0
    assert max(delays) - min(delays) > 1.0  # spread over most of the jitter range


def test_without_jitter_delays_are_exact() -> None:
    backoff = asyncq.Backoff(base=0.5, factor=3, cap=100, jitter=0)
    assert {backoff.delay(2) for _ in range(50)} == {1.5}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1},
        {"base": 5, "cap": 1},
        {"factor": 0.5},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"cap": float("inf")},
        {"base": float("nan")},
        {"factor": float("inf")},
        {"jitter": float("nan")},
        {"cap": 1e300},
        {"base": "1"},
    ],
    ids=repr,
)
def test_invalid_backoff_is_a_configuration_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(asyncq.ConfigurationError):
        asyncq.Backoff(**kwargs)


def test_backoff_is_immutable() -> None:
    backoff = asyncq.Backoff()
    with pytest.raises(AttributeError):
        backoff.base = 0  # type: ignore[misc]
