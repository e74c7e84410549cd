"""A process that fires schedules' slots straight through the store's fire statement, as
many workers' schedulers would at once, without the maintenance gate: only the database
stands between them and a slot fired twice.

``python -m tests.harness.firer DSN SCHEDULES ROUNDS BASE START``: the schedules are
``s0000``... (cron ``* * * * *``, UTC, rows the test wrote with ``last_slot = BASE``);
round k fires every schedule's slot BASE + k minutes, asking again until each is
settled. It starts at the unix time START (so that the processes overlap) and prints
the number of jobs it fired.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta

import anyio
import psycopg

from asyncq.schedule import Cron, Schedule
from asyncq.store import Store


def schedules(count: int) -> list[Schedule]:
    cron = Cron("* * * * *")
    return [
        Schedule(
            name=f"s{i:04d}",
            cron=cron,
            task_name="t",
            queue="default",
            args="{}",
            priority=0,
            max_attempts=1,
        )
        for i in range(count)
    ]


async def fire(dsn: str, count: int, rounds: int, base: datetime, start: float) -> int:
    store = Store()
    declared = schedules(count)
    fired = 0
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await anyio.sleep(max(0.0, start - time.time()))
        for k in range(1, rounds + 1):
            slot = base + timedelta(minutes=k)
            asked = declared
            while asked:
                results = await store.fire_schedules(conn, due=[(s, slot) for s in asked])
                fired += sum(1 for r in results if r.job_id is not None)
                unsettled = {r.schedule for r in results if not r.settled}
                asked = [s for s in asked if s.name in unsettled]
    return fired


if __name__ == "__main__":
    dsn, count, rounds, base, start = sys.argv[1:]
    print(anyio.run(fire, dsn, int(count), int(rounds), datetime.fromisoformat(base), float(start)))
