"""Priority aging across a real worker process: a stream of priority-10 jobs that never
ends keeps the worker busy, and one priority-0 job waits. With ``--priority-aging 1``
its priority rises a level a second, so it starts once it has waited about 10 s longer
than the oldest priority-10 job; with aging off it never starts while the stream
lasts. The same with a worker whose App has limited tasks (it claims with the limited
claim), for its unlimited tasks' jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.harness import app as plain_app
from tests.harness import limits_app
from tests.harness.jobs import insert_jobs, job_row
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

Db = psycopg.Connection[Any]
HIGH = 10
AGING = 1  # seconds a level: the low job overtakes after about HIGH * AGING seconds
BACKLOG = 30  # ready high jobs the stream keeps: every claim comes back full
# The App, its task of 50 ms for the stream (and its arguments), its task for the low
# job (and its arguments).
APPS = {
    "plain": (plain_app.APP, plain_app.SLEEP, {"seconds": 0.05}, plain_app.NOOP, {}),
    "limited": (limits_app.APP, limits_app.FREE, {"ms": 50}, limits_app.FREE, {"ms": 0}),
}


@contextmanager
def stream_of_high_priority_work(dsn: str, task: str, args: dict[str, Any]) -> Iterator[None]:
    """Keep `BACKLOG` priority-`HIGH` jobs of ``task`` ready until the block ends."""
    stop = threading.Event()

    def feed() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM asyncq_jobs WHERE status = 'queued' AND priority = %s",
                    (HIGH,),
                ).fetchone()
                assert row is not None
                if row[0] < BACKLOG:
                    insert_jobs(conn, task, [args] * BACKLOG, priority=HIGH)
                stop.wait(0.02)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        yield
    finally:
        stop.set()
        feeder.join(10)


def high_done(db: Db) -> int:
    row = db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE status = 'done' AND priority = %s", (HIGH,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def run(db: Db, workers: Workers, dsn: str, kind: str, aging: int, within: float) -> dict[str, Any]:
    """The low job's row after the stream ran for at most ``within`` seconds from its
    defer, with a worker of the App of ``kind`` and ``--priority-aging aging``."""
    app, stream, args, low_task, low_args = APPS[kind]
    worker = workers.start(
        "--concurrency", "2", "--poll-interval", "0.2", "--priority-aging", str(aging), app=app
    )
    with stream_of_high_priority_work(dsn, stream, args):
        wait_until(lambda: high_done(db) >= 20, 30, "the stream to run")
        (low,) = insert_jobs(db, low_task, [low_args], priority=0)
        deadline = time.monotonic() + within
        while job_row(db, low)["status"] != "done" and time.monotonic() < deadline:
            time.sleep(0.1)
        ran_meanwhile = high_done(db)
    assert set(workers.stop_all().values()) == {0}, worker.stderr()
    assert not workers.tracebacks(), workers.tracebacks()
    row = job_row(db, low)
    row["high_done"] = ran_meanwhile
    return row


@pytest.mark.parametrize("kind", APPS)
def test_a_low_priority_job_under_a_stream_that_never_ends_starts_once_aged(
    db: Db, workers: Workers, dsn: str, kind: str
) -> None:
    row = run(db, workers, dsn, kind, aging=AGING, within=30)
    assert row["status"] == "done", row
    waited = row["started_at"] - row["run_at"]
    # Not before the stream's jobs would have starved it (it was behind them: the
    # stream kept every claim full) ...
    assert waited >= timedelta(seconds=HIGH * AGING * 0.8), waited
    # ... and not much after its priority passed theirs (the aged claim looks every second).
    assert waited <= timedelta(seconds=HIGH * AGING + 5), waited


def test_without_aging_the_stream_starves_the_low_priority_job(
    db: Db, workers: Workers, dsn: str
) -> None:
    row = run(db, workers, dsn, "plain", aging=0, within=HIGH * AGING + 8)
    assert row["status"] == "queued", row
    assert row["high_done"] > 100, row  # the stream ran all along
