"""The App of the features benchmark (``benchmarks.features_app:app``): a no-op task, and
the features ``$BENCH_FEATURES`` names (comma-separated): ``limits`` (one task limited to
50 at once, another to 1,000 starts a second: every claim is then the limited one),
``schedules`` (100 schedules of a no-op task, every minute). Metrics are the worker's
``--metrics-port``, and result waiters a process of their own (`benchmarks.features`).
``$BENCH_ASYNCQ`` names the package to build it with (``asyncq_baseline`` for
``--baseline``)."""

from __future__ import annotations

import importlib
import os

# `benchmarks.features --baseline` runs this App on asyncq as it was at another commit
asyncq = importlib.import_module(os.environ.get("BENCH_ASYNCQ", "asyncq"))

FEATURES = set(filter(None, os.environ.get("BENCH_FEATURES", "").split(",")))
LIMITED = "limits" in FEATURES

app = asyncq.App()


@app.task(name="free")
async def free() -> None:
    pass


@app.task(name="capped", concurrency=50 if LIMITED else None)
async def capped() -> None:
    pass


@app.task(name="rated", rate_limit="1000/s" if LIMITED else None)
async def rated() -> None:
    pass


@app.task(name="tick")
async def tick(n: int) -> None:
    pass


if "schedules" in FEATURES:
    for n in range(100):
        app.schedule(tick, cron="* * * * *", name=f"bench-{n:03d}", kwargs={"n": n})
