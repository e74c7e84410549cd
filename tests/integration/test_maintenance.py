"""Maintenance: one worker at a time rescues expired leases and prunes old done rows,
behind one advisory-lock gate per piece."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.worker.maintenance import Maintainer
from asyncq.worker.maintenance.pruner import Pruner
from asyncq.worker.maintenance.rescuer import Rescuer
from asyncq.worker.observer import Observer

pytestmark = pytest.mark.anyio


class Rescued(Observer):
    def __init__(self) -> None:
        self.jobs: dict[int, str] = {}

    def rescued(self, jobs: Any) -> None:
        self.jobs.update(jobs)


def expired(db: Any, **columns: Any) -> int:
    row = db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, attempts, max_attempts, locked_by,"
        " locked_at, lease, expires_at)"
        " VALUES ('t', 'running', %(attempts)s, %(max_attempts)s, 'ghost:1:x',"
        " now() - interval '1 minute', interval '30 seconds', now() - interval '30 seconds')"
        " RETURNING id",
        {"attempts": 1, "max_attempts": 3, **columns},
    ).fetchone()
    return int(row[0])


async def test_one_worker_at_a_time_passes_the_gate(app: asyncq.App, db: Any, dsn: str) -> None:
    observer = Rescued()
    rescuer = Rescuer(store=app.store, interval=1, observer=observer)
    pruner = Pruner(store=app.store, interval=1, retention=timedelta(hours=1))
    maintainer = Maintainer(
        pool=app.pool, store=app.store, schema="public", pieces=[rescuer, pruner], observer=observer
    )
    again = expired(db)
    last = expired(db, attempts=3)
    old_done = db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, finished_at)"
        " VALUES ('t', 'done', now() - interval '2 hours'), ('t', 'done', now()) RETURNING id"
    ).fetchall()

    with psycopg.connect(dsn, autocommit=True) as other:
        # Another worker's rescuer is in its pass: this one's is skipped; pruning is not.
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(hashtext('asyncq.rescuer.public'))")
        assert await maintainer.gated(rescuer) is False
        assert await maintainer.gated(pruner) is False  # nothing more to prune after this
        other.execute("COMMIT")
    statuses = dict(db.execute("SELECT id, status::text FROM asyncq_jobs").fetchall())
    assert statuses == {again: "running", last: "running", old_done[1][0]: "done"}
    assert observer.jobs == {}

    assert await maintainer.gated(rescuer) is False
    assert observer.jobs == {again: "queued", last: "failed"}
    row = db.execute("SELECT last_error FROM asyncq_jobs WHERE id = %s", (again,)).fetchone()
    assert row[0].startswith("LeaseExpired: worker ghost:1:x stopped renewing its lease")
