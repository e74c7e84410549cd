"""Periodic jobs: @app.periodic, app.schedule, and current_job().scheduled_at.

From the repository root::

    python examples/periodic.py          # a few seconds: the latest missed slot fires
    python examples/periodic.py --wait   # up to a minute: waits for the next real slot

Cron has minute resolution, so a first slot can be a minute away. To finish in a few
seconds the example does what a deploy after an hour of downtime looks like: before the
worker starts, it writes each schedule's row as if its last slot were an hour ago. The
worker then fires each schedule's latest missed slot once (not the sixty missed
minutes), and the jobs print the slot they were made for. With ``--wait`` it leaves the
rows to the worker, and a new schedule starts at its next slot.

Each run starts afresh in a schema of its own, ``asyncq_periodic_example`` (dropped and
migrated again). The database is ``$ASYNCQ_DSN`` when it is set, else the embedded
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time

from psycopg import sql

import asyncq

QUEUE = "periodic"
SCHEMA = "asyncq_periodic_example"
TIMEOUT = 90.0

app = asyncq.App(schema=SCHEMA)


@app.periodic("* * * * *", name="periodic.heartbeat", queue=QUEUE)
async def heartbeat() -> None:
    slot = asyncq.current_job().scheduled_at
    assert slot is not None
    print(f"heartbeat for the slot {slot:%H:%M %Z}")


@app.task(queue=QUEUE, name="periodic.report")
async def report(region: str) -> None:
    slot = asyncq.current_job().scheduled_at
    assert slot is not None
    print(f"report for {region}, slot {slot:%H:%M %Z}")


# One task, two schedules: each has a name of its own and its own arguments.
app.schedule(report, cron="*/5 * * * *", name="report-eu", kwargs={"region": "eu"})
app.schedule(report, cron="@hourly", name="report-us", kwargs={"region": "us"})


def table(name: str) -> sql.Identifier:
    return sql.Identifier(SCHEMA, name)


async def start_afresh() -> None:
    async with app.pool.connection() as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA))
        )
    await app.migrate()


async def rewind_an_hour() -> None:
    """Each schedule's row as a worker declared it, with its last slot an hour ago."""
    async with app.pool.connection() as conn:
        for schedule in app.schedules.values():
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (name, task_name, cron, tz, kwargs, queue, last_slot)"
                    " VALUES (%s, %s, %s, %s, %s::jsonb, %s, now() - interval '1 hour')"
                ).format(table("asyncq_schedules")),
                (
                    schedule.name,
                    schedule.task_name,
                    schedule.cron.expression,
                    schedule.tz,
                    schedule.args,
                    schedule.queue,
                ),
            )


async def scheduled_jobs_done() -> int:
    async with app.pool.connection() as conn:
        cursor = await conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {} WHERE schedule IS NOT NULL AND status = 'done'"
            ).format(table("asyncq_jobs"))
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


async def main(wait: bool) -> int:
    started = time.time()
    async with app:
        await start_afresh()
        if not wait:
            await rewind_an_hour()
        worker = asyncio.create_task(app.run_worker(queues=[QUEUE], handle_signals=False))
        expected = 1 if wait else len(app.schedules)
        while time.time() - started < TIMEOUT and not worker.done():
            if await scheduled_jobs_done() >= expected:
                break
            await asyncio.sleep(0.1)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        done = await scheduled_jobs_done()
        schedules = await app.list_schedules()

    print()
    print(f"{'schedule':<20} {'cron':<12} {'last slot':<17} {'next slot':<17} last job")
    for info in schedules:
        if info.declared:
            last_job = f"{info.last_job_id} {info.last_job_status}" if info.last_job_id else "-"
            print(
                f"{info.name:<20} {info.cron:<12} {info.last_slot:%Y-%m-%d %H:%M}  "
                f"{info.next_slot:%Y-%m-%d %H:%M}  {last_job}"
            )
    if done >= expected:
        print(f"{done} scheduled jobs ran, each for its slot")
        return 0
    print(f"only {done} of {expected} scheduled jobs ran", file=sys.stderr)
    return 1


if __name__ == "__main__":
    logging.basicConfig(
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stdout
    )
    logging.getLogger("asyncq").setLevel(logging.INFO)
    sys.exit(asyncio.run(main(wait="--wait" in sys.argv[1:])))
