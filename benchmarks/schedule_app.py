"""The App of the schedules benchmark (``benchmarks.schedule_app:app``): ``$BENCH_SCHEDULES``
schedules (500 by default) of one no-op task, every minute."""

from __future__ import annotations

import os

import asyncq

SCHEDULES = int(os.environ.get("BENCH_SCHEDULES", "500"))

app = asyncq.App()


@app.task(name="bench.tick")
async def tick(n: int) -> None:
    pass


for n in range(SCHEDULES):
    app.schedule(tick, cron="* * * * *", name=f"bench-{n:04d}", kwargs={"n": n})
