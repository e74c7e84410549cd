"""A harness app with schedules (``tests.harness.periodic_app:app``), apart from the
harness app so that the other process tests' workers fire nothing.

``SCHEDULES`` schedules of one task, every minute; each run records ``slot=<its
scheduled_at>`` in the ledger (`tests.harness.ledger`).
"""

from __future__ import annotations

import os

import asyncq
from tests.harness.ledger import record

SCHEDULES = 20

app = asyncq.App(schema=os.environ.get("HARNESS_SCHEMA") or None)


@app.task(name="periodic.tick")
async def tick(n: int) -> None:
    slot = asyncq.current_job().scheduled_at
    assert slot is not None
    record(f"slot={slot.timestamp():.0f}")


for n in range(SCHEDULES):
    app.schedule(tick, cron="* * * * *", name=f"every-minute-{n:02d}", kwargs={"n": n})
