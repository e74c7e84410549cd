"""The App of the limits benchmark (``benchmarks.limits_app:app``): three no-op tasks.
With ``$BENCH_LIMITS=1`` one of them is limited to 50 at once and another to 1,000
starts a second (``$BENCH_RATE``, to try another rate), so the worker claims with the
limited claim; without it, none is."""

from __future__ import annotations

import os

import asyncq

LIMITED = os.environ.get("BENCH_LIMITS") == "1"

app = asyncq.App()


@app.task(name="free")
async def free() -> None:
    pass


@app.task(name="capped", concurrency=50 if LIMITED else None)
async def capped() -> None:
    pass


@app.task(name="rated", rate_limit=os.environ.get("BENCH_RATE", "1000/s") if LIMITED else None)
async def rated() -> None:
    pass
