"""Retry backoff: exponential, capped, with jitter. Pure."""

from __future__ import annotations

import random
from dataclasses import dataclass

from asyncq.errors import ConfigurationError


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    """How long a failed job waits before its next attempt.

    The wait after attempt ``n`` is ``base * factor ** (n - 1)``, capped at
    ``cap``, then stretched by a random fraction of up to ``jitter`` so that
    jobs that failed together do not come back together. It is never
    shorter than ``base``.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < self.base or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ConfigurationError(
                "Backoff needs 0 <= base <= cap, factor >= 1 and 0 <= jitter <= 1"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base * float(self.factor) ** exponent  # float: fails fast on overflow
        except OverflowError:
            raw = self.cap
        capped = min(raw, self.cap)
        fraction = (rng or random).random() * self.jitter
        return capped * (1.0 + fraction)
