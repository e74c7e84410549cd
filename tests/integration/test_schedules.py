"""Schedules against a real database: one job per slot whatever the number of firing
processes, only the latest missed slot after downtime, declarations that keep the last
slot, the maintenance gate, and the slot in the job's context."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import asyncq
from asyncq.worker.maintenance.scheduler import Scheduler
from asyncq.worker.observer import Observer
from tests.harness.processes import REPO

pytestmark = pytest.mark.anyio

FIRERS = 4
SCHEDULES = 200
ROUNDS = 5


def database_now(db: Any) -> datetime:
    return db.execute("SELECT now()").fetchone()[0]  # type: ignore[no-any-return]


def scheduler_of(app: asyncq.App) -> Scheduler:
    return Scheduler(
        pool=app.pool,
        store=app.store,
        schema="public",
        schedules=list(app.schedules.values()),
        observer=Observer(),
    )


def set_last_slot(db: Any, name: str, last_slot: datetime) -> None:
    db.execute("UPDATE asyncq_schedules SET last_slot = %s WHERE name = %s", (last_slot, name))


def test_each_slot_fires_once_however_many_processes_fire_it(db: Any, dsn: str) -> None:
    """FIRERS processes fire the same slots of SCHEDULES schedules at the same moments,
    round after round, through the fire statement alone (no gate): every (schedule,
    slot) has exactly one job and one fired-slot row. (With the statement's last_slot
    condition and the fired-slot check removed and the primary key dropped, slots fire
    several times and this test fails.)"""
    base = database_now(db).replace(second=0, microsecond=0) - timedelta(days=1)
    db.execute(
        "INSERT INTO asyncq_schedules (name, task_name, cron, tz, last_slot)"
        " SELECT format('s%%s', lpad(i::text, 4, '0')), 't', '* * * * *', 'UTC', %s"
        "   FROM generate_series(0, %s - 1) AS i",
        (base, SCHEDULES),
    )
    start = time.time() + 2.0  # every process connected and waiting by then
    args = [dsn, str(SCHEDULES), str(ROUNDS), base.isoformat(), str(start)]
    firers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.harness.firer", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(FIRERS)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in firers]
    assert [p.returncode for p in firers] == [0] * FIRERS, outputs

    fired = Counter(
        db.execute("SELECT schedule, scheduled_at FROM asyncq_jobs WHERE schedule IS NOT NULL")
    )
    expected = {
        (f"s{i:04d}", base + timedelta(minutes=k))
        for i in range(SCHEDULES)
        for k in range(1, ROUNDS + 1)
    }
    assert set(fired) == expected
    assert [pair for pair, n in fired.items() if n > 1] == []
    assert sum(int(out) for out in outputs) == SCHEDULES * ROUNDS
    runs = db.execute("SELECT count(*), count(DISTINCT (schedule, slot)) FROM asyncq_schedule_runs")
    assert runs.fetchone() == (SCHEDULES * ROUNDS, SCHEDULES * ROUNDS)
    last = db.execute(
        "SELECT DISTINCT s.last_slot, j.scheduled_at FROM asyncq_schedules s"
        " JOIN asyncq_jobs j ON j.id = s.last_job_id"
    ).fetchall()
    assert last == [(base + timedelta(minutes=ROUNDS),) * 2]


async def test_after_downtime_only_the_latest_missed_slot_fires(app: asyncq.App, db: Any) -> None:
    @app.periodic("*/5 * * * *", name="every-five", kwargs={"n": 1})
    async def every_five(n: int) -> None: ...

    @app.periodic("* * * * *", name="every-minute")
    async def every_minute() -> None: ...

    scheduler = scheduler_of(app)
    await scheduler.declare()
    now = database_now(db)
    for name in app.schedules:
        set_last_slot(db, name, now - timedelta(days=3))  # three days of missed slots
    await scheduler.declare()  # a worker starting after the downtime

    results = await scheduler.tick()
    assert sorted((r.schedule, r.job_id is not None, r.settled) for r in results) == [
        ("every-five", True, True),
        ("every-minute", True, True),
    ]
    rows = db.execute(
        "SELECT schedule, scheduled_at, task_name, args FROM asyncq_jobs ORDER BY schedule"
    ).fetchall()
    now = database_now(db)
    five, minute = (app.schedules[n].cron for n in ("every-five", "every-minute"))
    # The latest slot as of the fire (a minute boundary may have passed since).
    assert rows[0][:1] + rows[0][2:] == ("every-five", "every-five", {"n": 1})
    assert rows[0][1] in {five.latest(now), five.latest(now - timedelta(seconds=5))}
    assert rows[1][0] == "every-minute"
    assert rows[1][1] in {minute.latest(now), minute.latest(now - timedelta(seconds=5))}
    assert await scheduler.tick() == []  # nothing more is due: no burst
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (2,)


async def test_a_new_schedule_starts_at_its_next_slot(app: asyncq.App, db: Any) -> None:
    @app.periodic("* * * * *")
    async def fresh() -> None: ...

    scheduler = scheduler_of(app)
    before = database_now(db)
    await scheduler.declare()
    after = database_now(db)
    [(last_slot, last_job_id)] = db.execute(
        "SELECT last_slot, last_job_id FROM asyncq_schedules"
    ).fetchall()
    cron = app.schedules[fresh.name].cron
    assert last_slot in {cron.latest(before), cron.latest(after)} and last_job_id is None
    assert scheduler.upcoming[fresh.name] == cron.next_after(last_slot)
    if scheduler.upcoming[fresh.name] > after + timedelta(seconds=1):  # not at a boundary
        assert await scheduler.tick() == []
        assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (0,)


async def test_a_declaration_updates_a_schedule_and_keeps_its_last_slot(
    app: asyncq.App, db: Any, dsn: str
) -> None:
    @app.periodic("@hourly", kwargs={"n": 1})
    async def hourly(n: int) -> None: ...

    await scheduler_of(app).declare()
    long_ago = database_now(db) - timedelta(days=30)
    set_last_slot(db, hourly.name, long_ago)

    async with asyncq.App(dsn) as changed:

        @changed.task(name=hourly.name, queue="other")
        async def hourly_now(n: int) -> None: ...

        changed.schedule(hourly_now, cron="@daily", kwargs={"n": 2}, tz="Europe/Paris")
        await scheduler_of(changed).declare()

    row = db.execute("SELECT cron, tz, kwargs, queue, last_slot FROM asyncq_schedules").fetchone()
    assert row == ("@daily", "Europe/Paris", {"n": 2}, "other", long_ago)


async def test_one_scheduler_at_a_time_passes_the_gate(app: asyncq.App, db: Any, dsn: str) -> None:
    @app.periodic("* * * * *")
    async def gated() -> None: ...

    scheduler = scheduler_of(app)
    await scheduler.declare()
    set_last_slot(db, gated.name, database_now(db) - timedelta(hours=1))
    await scheduler.declare()
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(hashtext('asyncq.scheduler.public'))")
        assert await scheduler.tick() == []  # another worker is firing: wait for it
        assert scheduler._until_next() < 1.0
        other.execute("COMMIT")
    [result] = await scheduler.tick()
    assert result.job_id is not None and result.settled
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (1,)


async def test_a_slot_another_worker_fired_is_settled_without_a_job(
    app: asyncq.App, db: Any
) -> None:
    @app.periodic("* * * * *")
    async def twice() -> None: ...

    first, second = scheduler_of(app), scheduler_of(app)
    await first.declare()
    set_last_slot(db, twice.name, database_now(db) - timedelta(hours=1))
    await first.declare()
    await second.declare()
    [fired] = await first.tick()
    [seen] = await second.tick()
    assert fired.job_id is not None and fired.settled
    assert seen.job_id is None and seen.settled
    assert second.upcoming == first.upcoming
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (1,)


async def test_the_job_knows_its_slot(app: asyncq.App, db: Any, drain: Any) -> None:
    seen: dict[str, datetime | None] = {}

    @app.periodic("*/5 * * * *")
    async def slotted() -> None:
        seen["scheduled"] = asyncq.current_job().scheduled_at

    @app.task
    async def plain() -> None:
        seen["plain"] = asyncq.current_job().scheduled_at

    scheduler = scheduler_of(app)
    await scheduler.declare()
    set_last_slot(db, slotted.name, database_now(db) - timedelta(hours=1))
    await scheduler.declare()
    [result] = await scheduler.tick()
    await plain.defer()
    await drain()
    [(slot,)] = db.execute(
        "SELECT scheduled_at FROM asyncq_jobs WHERE id = %s", (result.job_id,)
    ).fetchall()
    assert seen == {"scheduled": slot, "plain": None}
    assert slot.tzinfo is not None and slot.second == 0 and slot.minute % 5 == 0


async def test_list_schedules_shows_slots_and_the_last_job(app: asyncq.App, db: Any) -> None:
    @app.periodic("*/5 * * * *")
    async def listed() -> None: ...

    app.schedule(listed, cron="@daily", name="listed-daily", tz="Europe/Paris")
    db.execute(
        "INSERT INTO asyncq_schedules (name, task_name, cron, tz, last_slot)"
        " VALUES ('gone', 'old.task', '@hourly', 'UTC', now())"
    )
    scheduler = Scheduler(
        pool=app.pool,
        store=app.store,
        schema="public",
        schedules=[app.schedules[listed.name]],
        observer=Observer(),
    )
    await scheduler.declare()
    set_last_slot(db, listed.name, database_now(db) - timedelta(hours=1))
    await scheduler.declare()
    [result] = await scheduler.tick()

    found = {info.name: info for info in await app.list_schedules()}
    assert list(found) == sorted(["gone", listed.name, "listed-daily"])
    info = found[listed.name]
    assert (info.cron, info.tz, info.task_name, info.declared) == (
        "*/5 * * * *",
        "UTC",
        listed.name,
        True,
    )
    assert (info.last_job_id, info.last_job_status) == (result.job_id, "queued")
    assert info.last_slot is not None and info.next_slot == info.last_slot + timedelta(minutes=5)
    daily = found["listed-daily"]  # declared, but no worker has written it yet
    assert daily.last_slot is None and daily.next_slot is not None
    assert daily.next_slot.astimezone(app.schedules["listed-daily"].cron.tz).hour == 0
    assert found["gone"].declared is False and found["gone"].task_name == "old.task"


async def test_a_worker_without_the_scheduler_grants_says_which_it_lacks(
    app: asyncq.App, db: Any, dsn: str
) -> None:
    role = f"asyncq_no_schedules_{secrets.token_hex(4)}"
    db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        db.execute(f'GRANT SELECT, DELETE ON asyncq_jobs, asyncq_migrations TO "{role}"')
        db.execute(
            "GRANT UPDATE (status, attempts, claims, handbacks, run_at, locked_by, locked_at,"
            f' lease, expires_at, last_error, finished_at) ON asyncq_jobs TO "{role}"'
        )
        db.execute(f'GRANT INSERT (task_name, queue, args) ON asyncq_jobs TO "{role}"')
        db.execute(f'GRANT SELECT ON asyncq_schedules TO "{role}"')
        params = conninfo_to_dict(dsn)
        params.pop("password", None)
        limited = asyncq.App(make_conninfo(**{**params, "user": role}))

        @limited.periodic("@hourly")
        async def hourly() -> None: ...

        with pytest.raises(asyncq.ConfigurationError) as raised:
            await limited.run_worker(drain=True, handle_signals=False)
        lacks = str(raised.value).split("; it lacks ")[1]
        assert (
            'INSERT on "public"."asyncq_schedules", UPDATE on "public"."asyncq_schedules",'
            ' SELECT on "public"."asyncq_schedule_runs", INSERT on "public"."asyncq_schedule_runs",'
            ' INSERT (priority) on "public"."asyncq_jobs", INSERT (max_attempts) on'
            ' "public"."asyncq_jobs", INSERT (schedule) on "public"."asyncq_jobs", INSERT'
            ' (scheduled_at) on "public"."asyncq_jobs"'
        ) in lacks
    finally:
        db.execute(f'DROP OWNED BY "{role}"')
        db.execute(f'DROP ROLE "{role}"')
