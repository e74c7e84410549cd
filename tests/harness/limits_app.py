"""Tasks with limits, for the tests that run worker processes against them
(``tests.harness.limits_app:app``). A separate App from `tests.harness.app`: a worker
whose App has a limited task claims every job with the limited claim, and the other
tests' workers should claim as an App without limits does.

The environment sets the App up as for `tests.harness.app`: ``$ASYNCQ_DSN`` and
``$HARNESS_SCHEMA``. Every execution appends ``start`` and ``end`` to the ledger.
"""

from __future__ import annotations

import asyncio
import os

import asyncq
from tests.harness.ledger import record

app = asyncq.App(schema=os.environ.get("HARNESS_SCHEMA") or None)

APP = "tests.harness.limits_app:app"
CAPPED_AT = 3
GROUP_CAP = 2
RATE = 10  # per second
TENANT_CAP = 4  # group_concurrency of `tenant` in code
METERED_RATE = 20  # per second, of `metered` in code
METERED_QUEUE = "metered"


@app.task(concurrency=CAPPED_AT)
async def capped(ms: int) -> None:
    record("start")
    await asyncio.sleep(ms / 1000)
    record("end")


@app.task(group_concurrency=GROUP_CAP)
async def grouped(ms: int) -> None:
    record("start")
    await asyncio.sleep(ms / 1000)
    record("end")


@app.task(rate_limit=f"{RATE}/s")
async def rated(n: int) -> None:
    record("start")
    record("end")


@app.task(concurrency=1)
async def single(ms: int) -> None:
    record("start")
    await asyncio.sleep(ms / 1000)
    record("end")


@app.task(group_concurrency=TENANT_CAP)
async def tenant(ms: int) -> None:
    record("start")
    await asyncio.sleep(ms / 1000)
    record("end")


@app.task(rate_limit=f"{METERED_RATE}/s", queue=METERED_QUEUE)
async def metered(n: int) -> None:
    record("start")
    record("end")


@app.task
async def free(ms: int) -> None:
    record("start")
    await asyncio.sleep(ms / 1000)
    record("end")


CAPPED = capped.name
GROUPED = grouped.name
RATED = rated.name
FREE = free.name
SINGLE = single.name
TENANT = tenant.name
METERED = metered.name
