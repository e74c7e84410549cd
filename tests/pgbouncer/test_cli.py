"""The ``asyncq`` command through PgBouncer in transaction mode, as an operator runs it:
``migrate``, worker processes (listening straight to the server, or polling), and the
admin commands ``jobs``, ``job``, ``queues``, ``stats``, ``requeue``, ``cancel``,
``pause`` and ``resume``. The harness app is configured as the PgBouncer guide says
(``$HARNESS_PREPARE_THRESHOLD=none``, ``$HARNESS_LISTEN_DSN`` or ``$HARNESS_LISTEN=0``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness.app import APP, FAIL, SLEEP, WORK
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.pgbouncer import PgBouncer
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until


@pytest.fixture
def workers(dsn: str, bouncer: PgBouncer, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    """Worker processes and commands of the harness app through PgBouncer, their LISTEN
    connections straight to the server."""
    started = Workers(
        bouncer.through(dsn),
        ledger,
        tmp_path,
        HARNESS_PREPARE_THRESHOLD="none",
        HARNESS_LISTEN_DSN=dsn,
    )
    try:
        yield started
    finally:
        started.kill_all()


def statuses(db: psycopg.Connection[Any], ids: list[int]) -> list[str]:
    rows = db.execute(
        "SELECT status::text FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    return [r[0] for r in rows]


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    return str(done.stdout)


def test_migrate_an_empty_database(
    workers: Workers, bouncer: PgBouncer, throwaway_dsn: str
) -> None:
    env = workers.env(ASYNCQ_DSN=bouncer.through(throwaway_dsn))
    first = workers.cli("migrate", APP, env=env)
    assert first.returncode == 0 and "schema migrated to version" in first.stderr, first.stderr
    again = workers.cli("migrate", APP, env=env)
    assert again.returncode == 0 and "schema already up to date" in again.stderr, again.stderr


def test_a_worker_and_the_admin_commands(db: Any, workers: Workers, ledger: Ledger) -> None:
    worker = workers.start("--concurrency", "4", "--poll-interval", "30", lease=300)
    # Polling every 30 s: each job below starts by its notification, and the cancel
    # reaches its job by one (the heartbeat, every quarter of the lease, comes much later).
    done = insert_jobs(db, WORK, [{"tag": n} for n in range(5)])
    [failed] = insert_jobs(db, FAIL, [{"tag": 1}], queue="risky")
    wait_until(lambda: set(statuses(db, [*done, failed])) == {"done", "failed"}, 15, "the jobs")
    assert statuses(db, done) == ["done"] * 5

    listing = ok(workers.cli("jobs", APP, "--status", "failed"))
    assert f"{failed} " in listing and "RuntimeError" in listing
    one = json.loads(ok(workers.cli("job", APP, str(failed), "--json")))
    assert (one["id"], one["status"], one["attempts_used"]) == (failed, "failed", 3)
    assert [a["outcome"] for a in one["attempts"]] == ["retried", "retried", "failed"]
    lines = ok(workers.cli("queues", APP, "--json")).splitlines()
    queues = {q["name"]: q for q in map(json.loads, lines)}
    assert queues["risky"]["failed"] == 1
    assert "dead" in ok(workers.cli("stats", APP)).lower()

    requeued = ok(workers.cli("requeue", APP, str(failed)))
    assert requeued.strip() == f"requeued 1 jobs: {failed}"
    wait_until(lambda: len(ledger.events("start", failed)) == 6, 15, "the requeued job's runs")
    wait_until(lambda: statuses(db, [failed]) == ["failed"], 15, "the requeued job to end")

    [running] = insert_jobs(db, SLEEP, [{"seconds": 60}])
    wait_until(lambda: ledger.events("start", running), 10, "the long job to start")
    asked = json.loads(ok(workers.cli("cancel", APP, str(running), "--json")))
    assert asked == {str(running): "aborting"}
    wait_until(lambda: statuses(db, [running]) == ["cancelled"], what="the abort")

    assert ok(workers.cli("pause", APP, "mail")).strip() == "queue mail paused"
    held = insert_jobs(db, WORK, [{"tag": n} for n in range(3)], queue="mail")
    other = insert_jobs(db, WORK, [{"tag": 9}], queue="reports")
    wait_until(lambda: statuses(db, other) == ["done"], 10, "the other queue's job")
    assert set(statuses(db, held)) == {"queued"}
    assert ok(workers.cli("resume", APP, "mail")).strip() == "queue mail resumed"
    wait_until(lambda: set(statuses(db, held)) == {"done"}, 10, "the resumed queue's jobs")

    worker.send(15)
    assert worker.wait(20) == 0
    assert not workers.tracebacks()


def test_a_worker_without_listen_polls(db: Any, workers: Workers) -> None:
    env = workers.env(HARNESS_LISTEN="0", HARNESS_LISTEN_DSN="")
    worker = workers.start("--poll-interval", "0.2", env=env)
    ids = insert_jobs(db, WORK, [{"tag": n} for n in range(10)])
    wait_until(lambda: set(statuses(db, ids)) == {"done"}, 15, "the jobs to run")
    listeners = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'asyncq:%:listener'"
    ).fetchone()
    assert listeners == (0,)
    worker.send(15)
    assert worker.wait(20) == 0
    assert not workers.tracebacks()
