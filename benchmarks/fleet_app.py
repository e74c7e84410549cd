"""The App of the fleet benchmark (``benchmarks.fleet_app:app``): one task that sleeps
``ms`` milliseconds (none: a no-op)."""

from __future__ import annotations

import asyncio

import asyncq

app = asyncq.App()


@app.task(name="sleep_ms", max_attempts=10)
async def sleep_ms(ms: int = 0) -> None:
    if ms:
        await asyncio.sleep(ms / 1000)
