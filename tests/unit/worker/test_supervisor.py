"""When a worker runs two claim loops: its slots, with the jobs held ahead, hold two
batches."""

from __future__ import annotations

import pytest

from asyncq.worker.settings import WorkerSettings
from asyncq.worker.supervisor import claim_loops


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "prefetch", "loops"),
    [
        (10, 10, 0, 1),
        (19, 10, 0, 1),
        (20, 10, 0, 2),
        (200, 100, 0, 2),
        (50, 10, 0, 2),
        (10, None, 0, 1),
        (100, 100, 200, 2),
        (10, None, 200, 2),
        (100, 100, 99, 1),
    ],
)
def test_claim_loops(concurrency: int, batch_size: int | None, prefetch: int, loops: int) -> None:
    settings = WorkerSettings(concurrency=concurrency, batch_size=batch_size, prefetch=prefetch)
    assert claim_loops(settings) == loops
