"""Schedules with real worker processes: after downtime, three workers fire each
schedule's latest slot once, and the job sees its slot; ``asyncq schedules`` lists them."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.harness.periodic_app import SCHEDULES
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

APP = "tests.harness.periodic_app:app"
WORKERS = 3


def minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def test_workers_fire_the_latest_missed_slot_once(workers: Workers, db: Any) -> None:
    """The schedules' rows say their last slot was two hours ago (the workers were down):
    each schedule fires once, for the latest slot, not for the 120 missed ones, however
    many workers start; the job's current_job().scheduled_at is that slot."""
    [before] = db.execute("SELECT now()").fetchone()
    db.execute(
        "INSERT INTO asyncq_schedules (name, task_name, cron, tz, last_slot)"
        " SELECT format('every-minute-%%s', lpad(n::text, 2, '0')), 'periodic.tick',"
        "        '* * * * *', 'UTC', %s"
        "   FROM generate_series(0, %s - 1) AS n",
        (minute(before) - timedelta(hours=2), SCHEDULES),
    )
    started = [workers.start(app=APP) for _ in range(WORKERS)]
    wait_until(
        lambda: (
            db.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'").fetchone()[0]
            >= SCHEDULES
        ),
        30,
        "a job of every schedule to be done",
    )
    assert workers.stop_all() == {w.pid: 0 for w in started}
    assert not workers.tracebacks(), workers.tracebacks()

    jobs = db.execute(
        "SELECT id, schedule, scheduled_at, status::text, args FROM asyncq_jobs"
    ).fetchall()
    # A minute boundary may pass while the workers run: its slot fires too, once.
    per_slot = Counter((schedule, slot) for _, schedule, slot, _, _ in jobs)
    assert [pair for pair, n in per_slot.items() if n > 1] == []
    first = {
        name: min(slot for _, schedule, slot, _, _ in jobs if schedule == name)
        for name in {schedule for _, schedule, _, _, _ in jobs}
    }
    assert sorted(first) == [f"every-minute-{n:02d}" for n in range(SCHEDULES)]
    # The first slot fired is the latest one when the workers started: no burst.
    assert set(first.values()) <= {minute(before), minute(before) + timedelta(minutes=1)}
    assert all(args == {"n": int(schedule[-2:])} for _, schedule, _, _, args in jobs)
    runs = db.execute("SELECT schedule, slot, job_id FROM asyncq_schedule_runs").fetchall()
    assert sorted(runs) == sorted((schedule, slot, id_) for id_, schedule, slot, _, _ in jobs)

    done = {id_: slot for id_, _, slot, status, _ in jobs if status == "done"}
    ran = {e.job_id: e.event for e in workers.ledger.entries() if e.event.startswith("slot=")}
    assert ran == {id_: f"slot={slot.timestamp():.0f}" for id_, slot in done.items()}


def test_schedules_command_lists_the_schedules(workers: Workers, db: Any) -> None:
    [before] = db.execute("SELECT now()").fetchone()
    db.execute(
        "INSERT INTO asyncq_schedules (name, task_name, cron, tz, last_slot, last_job_id)"
        " VALUES ('every-minute-00', 'periodic.tick', '* * * * *', 'UTC', %s, 42)",
        (minute(before),),
    )
    listed = workers.cli("schedules", APP, "--json")
    assert listed.returncode == 0, listed.stderr
    found = {s["name"]: s for s in map(json.loads, listed.stdout.splitlines())}
    assert len(found) == SCHEDULES
    first = found["every-minute-00"]
    assert first == {
        "name": "every-minute-00",
        "task_name": "periodic.tick",
        "cron": "* * * * *",
        "tz": "UTC",
        "queue": None,
        "next_slot": first["next_slot"],
        "last_slot": minute(before).isoformat(),
        "last_job_id": 42,
        "last_job_status": None,
        "declared": True,
    }
    next_slot = datetime.fromisoformat(first["next_slot"])
    assert next_slot > before and next_slot.second == 0 and next_slot.tzinfo == UTC
    assert found["every-minute-01"]["last_slot"] is None  # no worker has declared it yet

    table = workers.cli("schedules", APP)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("name ")
    assert "next slot" in lines[0] and lines[0].endswith("last job")
    assert len(lines) == 1 + SCHEDULES
    assert lines[1].startswith("every-minute-00  * * * * *  UTC  periodic.tick")
    assert lines[1].endswith("42 pruned")
