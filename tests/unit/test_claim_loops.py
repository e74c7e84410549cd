"""When a worker runs two claim loops: its slots hold two batches and its pool can
spare the connections."""

from __future__ import annotations

import pytest
from psycopg_pool import AsyncConnectionPool

from asyncq.worker.supervisor import WorkerSettings, claim_loops


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "pool_max", "loops"),
    [
        (10, 10, 10, 1),
        (19, 10, 10, 1),
        (20, 10, 10, 2),
        (200, 100, 10, 2),
        (50, 10, 10, 2),
        (20, 10, 3, 1),  # two claims, the outcome writes and the jobs need four
        (20, 10, 4, 2),
    ],
)
def test_claim_loops(concurrency: int, batch_size: int, pool_max: int, loops: int) -> None:
    pool = AsyncConnectionPool("", min_size=1, max_size=pool_max, open=False)
    settings = WorkerSettings(concurrency=concurrency, batch_size=batch_size)
    assert claim_loops(settings, pool) == loops
