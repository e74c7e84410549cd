"""Waiting times: retry backoff (exponential, capped, with jitter) and the bounds every
delay asyncq writes must keep. Pure."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta

from asyncq.errors import ConfigurationError

# The longest wait asyncq writes (a defer's delay, a retry's backoff, a snooze): ten years.
# Beyond it PostgreSQL's intervals and timestamps would overflow sooner or later.
MAX_DELAY = 10 * 365 * 24 * 3600.0


def seconds(value: object, name: str, *, minimum: float = 0.0, maximum: float = MAX_DELAY) -> float:
    """``value`` (seconds or a timedelta) as a float within the bounds; ValueError if not."""
    number = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(number, bool)
        or not isinstance(number, int | float)
        or not minimum <= number <= maximum  # also refuses NaN
    ):
        raise ValueError(
            f"{name} must be a number of seconds from {minimum:g} to {maximum:g}, not {value!r}"
        )
    return float(number)


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    """How long a failed job waits before its next attempt.

    The wait after attempt ``n`` is ``base * factor ** (n - 1)``, capped at
    ``cap``, then stretched by a random fraction of up to ``jitter`` so that
    jobs that failed together do not come back together. It is never
    shorter than ``base``, and ``cap`` is at most ten years.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        try:
            seconds(self.base, "base")
            seconds(self.cap, "cap", minimum=self.base, maximum=MAX_DELAY / 2)
            seconds(self.factor, "factor", minimum=1.0, maximum=1e6)
            seconds(self.jitter, "jitter", maximum=1.0)
        except ValueError as exc:
            raise ConfigurationError(
                f"Backoff needs 0 <= base <= cap <= {MAX_DELAY / 2:g} seconds, a finite"
                f" factor >= 1 and 0 <= jitter <= 1: {exc}"
            ) from None

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base * math.pow(self.factor, exponent)
        except OverflowError:
            raw = self.cap
        capped = min(raw, self.cap)
        fraction = (rng or random).random() * self.jitter
        return capped * (1.0 + fraction)
