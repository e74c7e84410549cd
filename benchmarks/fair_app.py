"""The App of the fair groups' shares (``benchmarks.fair_app:app``): one task whose job
sleeps ``ms`` milliseconds, so that a worker's concurrency sets its jobs per second."""

from __future__ import annotations

import asyncio

import asyncq

TASK = "bench.tenant_job"

app = asyncq.App()


@app.task(name=TASK)
async def tenant_job(tenant: str, ms: int) -> None:
    await asyncio.sleep(ms / 1000)
