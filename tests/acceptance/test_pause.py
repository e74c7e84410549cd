"""Pause and resume a queue across worker processes: no worker claims from a paused queue
(other queues go on), running jobs finish, defers still write; resume wakes the workers."""

from __future__ import annotations

import time

from tests.harness.app import SLEEP, WORK
from tests.harness.jobs import insert_jobs, job_row
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until


def statuses(db, ids: list[int]) -> list[str]:
    rows = db.execute(
        "SELECT status::text FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    return [r[0] for r in rows]


def test_no_worker_claims_from_a_paused_queue_until_it_is_resumed(
    db, workers: Workers, ledger: Ledger
) -> None:
    for _ in range(2):
        workers.start("--concurrency", "4", "--poll-interval", "0.2", lease=5)
    [running] = insert_jobs(db, SLEEP, [{"seconds": 1.5}], queue="mail")
    wait_until(lambda: ledger.events("start", running), 10, "the job to start")

    paused = workers.cli("pause", "tests.harness.app:app", "mail")
    assert (paused.returncode, paused.stdout.strip()) == (0, "queue mail paused"), paused.stderr
    again = workers.cli("pause", "tests.harness.app:app", "mail")
    assert again.stdout.strip() == "queue mail was paused already"

    held = insert_jobs(db, WORK, [{"tag": n} for n in range(20)], queue="mail")
    other = insert_jobs(db, WORK, [{"tag": n} for n in range(20)], queue="reports")
    wait_until(lambda: set(statuses(db, other)) == {"done"}, 10, "the other queue's jobs")
    # The job that was running when the queue paused finishes.
    wait_until(lambda: job_row(db, running)["status"] == "done", 10, "the running job to end")
    time.sleep(1.5)  # several polls and notifications later, none may have taken them
    assert set(statuses(db, held)) == {"queued"}
    assert not any(ledger.events("start", job_id) for job_id in held)

    resumed = workers.cli("resume", "tests.harness.app:app", "mail")
    assert (resumed.returncode, resumed.stdout.strip()) == (0, "queue mail resumed")
    wait_until(lambda: set(statuses(db, held)) == {"done"}, what="the held jobs to run")
    again = workers.cli("resume", "tests.harness.app:app", "mail")
    assert again.stdout.strip() == "queue mail was not paused"
    assert not workers.tracebacks()
