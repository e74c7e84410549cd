"""When a worker runs two claim loops: its slots hold two batches."""

from __future__ import annotations

import pytest

from asyncq.worker.settings import WorkerSettings
from asyncq.worker.supervisor import claim_loops


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "loops"),
    [(10, 10, 1), (19, 10, 1), (20, 10, 2), (200, 100, 2), (50, 10, 2), (10, None, 1)],
)
def test_claim_loops(concurrency: int, batch_size: int | None, loops: int) -> None:
    settings = WorkerSettings(concurrency=concurrency, batch_size=batch_size)
    assert claim_loops(settings) == loops
