"""A schedule's slot comes while the server is down: once it is back, the slot fires, once.

Two worker processes of the periodic harness app (twenty schedules, every minute) run;
the server stops a few seconds before a minute boundary and starts again a few seconds
after it, so the restart falls between the slot and its insert. Waits for a minute
boundary: about a minute.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import Db, create_database, fault_workers
from tests.harness.periodic_app import SCHEDULES
from tests.harness.waiting import wait_until

APP = "tests.harness.periodic_app:app"
DOWN_BEFORE = 3.0  # seconds before the slot the server stops
UP_AFTER = 3.0  # seconds after the slot it starts again


@pytest.mark.timeout(180)
def test_a_slot_due_while_the_server_is_down_fires_once_when_it_is_back(
    server: ControlledPostgres, tmp_path: Path
) -> None:
    dsn = create_database(server, "schedule_restart")
    workers = fault_workers(dsn, tmp_path)
    try:
        with Db(dsn) as db:
            started = [workers.start(app=APP) for _ in range(2)]
            wait_until(
                lambda: db.value("SELECT count(*) FROM asyncq_schedules") == SCHEDULES,
                20,
                "the workers to declare the schedules",
            )
            now = db.value("SELECT now()")
            slot = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
            if (slot - now).total_seconds() < DOWN_BEFORE + 2:
                slot += timedelta(minutes=1)
            time.sleep((slot - now).total_seconds() - DOWN_BEFORE)
            assert db.value("SELECT count(*) FROM asyncq_jobs WHERE scheduled_at = %s", slot) == 0
            server.stop("fast")
            time.sleep(DOWN_BEFORE + UP_AFTER)
            server.start()
            db.close()  # broken by the restart

            def fired() -> list[tuple[str, str]]:
                rows = db.rows(
                    "SELECT schedule, status::text FROM asyncq_jobs WHERE scheduled_at = %s",
                    slot,
                )
                done = [r for r in rows if r[1] == "done"]
                return rows if len(done) >= SCHEDULES else []

            wait_until(fired, 60, "every schedule's slot to fire and its job to run")
            exits = workers.stop_all()
            per_slot = Counter(db.rows("SELECT schedule, scheduled_at FROM asyncq_jobs"))
            runs = db.value("SELECT count(*) FROM asyncq_schedule_runs WHERE slot = %s", slot)
            at_slot = db.rows("SELECT schedule FROM asyncq_jobs WHERE scheduled_at = %s", slot)
    finally:
        workers.kill_all()

    assert exits == {w.pid: 0 for w in started}, exits
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    assert sorted(s for (s,) in at_slot) == [f"every-minute-{n:02d}" for n in range(SCHEDULES)]
    assert [pair for pair, n in per_slot.items() if n > 1] == []
    assert runs == SCHEDULES
