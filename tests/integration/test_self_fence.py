"""The self-fence, in-process: a worker whose renewals cannot get through stops the attempt
before its lease runs out in the database, and writes nothing for it.

Here the renewals are held back by a row lock of the test's own (the heartbeat's UPDATE
waits behind it until its deadline cuts it): the database is real and answers everything
else. The silent network is in ``tests/faults/test_self_fence.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

import asyncq
from asyncq.worker.settings import FENCE_AFTER

pytestmark = pytest.mark.anyio

LEASE = 2.0


async def test_a_worker_that_cannot_renew_a_lease_stops_the_attempt_while_it_is_still_held(
    app: asyncq.App, aconn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    started = asyncio.Event()
    cancelled: list[float] = []
    loop = asyncio.get_running_loop()

    @app.task(name="fence.long")
    async def long() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(loop.time())
            raise

    job_id = await long.defer()
    worker = asyncio.create_task(
        app.run_worker(drain=True, handle_signals=False, lease=LEASE, concurrency=1)
    )
    async with asyncio.timeout(10):
        await started.wait()
    async with aconn.transaction():
        # Every renewal from now on waits behind this lock, and is cut at its deadline.
        await aconn.execute("SELECT FROM asyncq_jobs WHERE id = %s FOR UPDATE", (job_id,))
        locked_at = loop.time()
        await asyncio.wait([worker], timeout=10)  # a drain ends once the attempt is given up
        cur = await aconn.execute(
            "SELECT status::text, attempts, extract(epoch FROM expires_at - clock_timestamp())"
            "  FROM asyncq_jobs WHERE id = %s",
            (job_id,),
        )
        status, attempts, lease_left = await cur.fetchone()
    if not worker.done():  # the lock is gone: the worker can write what it has to
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        pytest.fail(f"the attempt was not stopped within 10 s (its lease: {lease_left}s left)")
    stats = worker.result()
    # Stopped within FENCE_AFTER of a lease of the last renewal (sent before the lock) ...
    assert cancelled and cancelled[0] - locked_at < FENCE_AFTER * LEASE + 0.5, cancelled
    # ... while the database still held the lease for it: no other worker could take it yet.
    assert lease_left > 0, lease_left
    assert (status, attempts) == ("running", 1)  # nothing written: the lease brings it back
    assert (stats.fenced, stats.lost, stats.done) == (1, 1, 0), stats
    assert f"job {job_id} (fence.long): lease not renewed for" in caplog.text
