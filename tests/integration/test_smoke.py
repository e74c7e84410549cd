import pytest

import asyncq

pytestmark = pytest.mark.anyio


async def test_defer_and_drain(app: asyncq.App, db) -> None:
    seen = []

    @app.task
    async def add(a: int, b: int) -> None:
        seen.append((a + b, asyncq.current_job().attempt))

    job_id = await add.defer(1, b=2)
    stats = await app.run_worker(drain=True, handle_signals=False)
    assert seen == [(3, 1)]
    assert stats.done == 1
    row = db.execute("SELECT status, args FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row == ("done", {"a": 1, "b": 2})
