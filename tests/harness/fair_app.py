"""A task whose jobs are deferred in groups, on an App without any limit
(``tests.harness.fair_app:app``): its workers claim it by turns once they read that it
is deferred in groups. Set up as `tests.harness.app` is (``$ASYNCQ_DSN``,
``$HARNESS_SCHEMA``); every execution appends ``start`` and ``end`` to the ledger."""

from __future__ import annotations

import asyncio
import os

import asyncq
from tests.harness.ledger import record

app = asyncq.App(schema=os.environ.get("HARNESS_SCHEMA") or None)

APP = "tests.harness.fair_app:app"


@app.task
async def tenant_job(ms: int) -> None:
    record("start")
    await asyncio.sleep(ms / 1000)
    record("end")


TENANT_JOB = tenant_job.name
