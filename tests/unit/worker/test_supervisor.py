"""When a worker runs two claim loops: its slots, with the jobs held ahead, hold two
batches (an App with limited tasks holds none ahead)."""

from __future__ import annotations

import pytest

from asyncq.worker.settings import WorkerSettings
from asyncq.worker.supervisor import claim_loops


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "prefetch", "limited", "loops"),
    [
        (10, 10, 0, False, 1),
        (19, 10, 0, False, 1),
        (20, 10, 0, False, 2),
        (200, 100, 0, False, 2),
        (50, 10, 0, False, 2),
        (10, None, 0, False, 1),
        (100, 100, 200, False, 2),
        (10, None, 200, False, 2),
        (100, 100, 99, False, 1),
        (100, 100, 200, True, 1),
        (200, 100, 200, True, 2),
    ],
)
def test_claim_loops(
    concurrency: int, batch_size: int | None, prefetch: int, limited: bool, loops: int
) -> None:
    settings = WorkerSettings(concurrency=concurrency, batch_size=batch_size, prefetch=prefetch)
    assert claim_loops(settings, limited=limited) == loops
