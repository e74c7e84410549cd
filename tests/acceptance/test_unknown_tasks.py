"""Workers that meet jobs of tasks they do not know, as real processes: two Apps of
different services on one table, and the old and the new version of one App side by
side in a rolling deploy. No job is failed or counted by a worker that does not know its
task; each runs once, on a worker that does."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import psycopg

from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

SHARED = "tests.harness.shared_apps"


def insert(db: psycopg.Connection[Any], task: str, count: int) -> list[int]:
    rows = db.execute(
        "INSERT INTO asyncq_jobs (task_name, args) SELECT %s, jsonb_build_object('n', g)"
        " FROM generate_series(1, %s) AS g RETURNING id",
        (task, count),
    ).fetchall()
    return [row[0] for row in rows]


def states(db: psycopg.Connection[Any], ids: list[int]) -> Counter[tuple[str, int]]:
    rows = db.execute(
        "SELECT status::text, attempts FROM asyncq_jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return Counter((status, attempts) for status, attempts in rows)


def runs(ledger: Ledger) -> Counter[int]:
    return Counter(e.job_id for e in ledger.entries() if e.event == "start")


def test_two_apps_on_one_table_each_run_their_own_jobs(
    workers: Workers, db: psycopg.Connection[Any], ledger: Ledger
) -> None:
    billing = workers.start(app=f"{SHARED}:billing")
    shipping = workers.start(app=f"{SHARED}:shipping")
    charges = insert(db, "billing.charge", 50)
    shipments = insert(db, "shipping.ship", 50)
    every = charges + shipments
    wait_until(
        lambda: states(db, every) == Counter({("done", 1): 100}),
        60,
        "every job done, by its own App's worker, at its first attempt",
    )
    assert runs(ledger) == Counter(dict.fromkeys(every, 1))
    by_pid = {e.job_id: e.pid for e in ledger.entries()}
    assert {by_pid[i] for i in charges} == {billing.pid}
    assert {by_pid[i] for i in shipments} == {shipping.pid}
    assert workers.tracebacks() == []


def test_a_rolling_deploy_that_adds_a_task_loses_none_of_its_jobs(
    workers: Workers, db: psycopg.Connection[Any], ledger: Ledger
) -> None:
    old = workers.start(app=f"{SHARED}:orders_v1")
    places = insert(db, "orders.place", 10)
    notices = insert(db, "orders.notify", 10)  # written by the new version, out first
    wait_until(
        lambda: states(db, places) == Counter({("done", 1): 10}),
        60,
        "the old version runs the jobs of the task it knows",
    )
    # The old version gives the new task's jobs back, uncounted, and claims no more of
    # them: they wait, queued, for a worker that knows the task.
    wait_until(
        lambda: (
            db.execute(
                "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND unknown_since IS NOT NULL",
                (notices,),
            ).fetchone()
            == (10,)
        ),
        30,
        "the old version gave every new job back",
    )
    claims = "SELECT sum(claims) FROM asyncq_jobs WHERE id = ANY(%s)"
    before = db.execute(claims, (notices,)).fetchone()
    time.sleep(2)  # a window in which the old worker would burn them, or claim them again
    assert states(db, notices) == Counter({("queued", 0): 10})
    assert db.execute(claims, (notices,)).fetchone() == before  # it claims them no more
    new = workers.start(app=f"{SHARED}:orders_v2")
    wait_until(
        lambda: states(db, notices) == Counter({("done", 1): 10}),
        60,
        "the new version runs them, at their first counted attempt",
    )
    assert runs(ledger) == Counter(dict.fromkeys(places + notices, 1))
    by_pid = {e.job_id: e.pid for e in ledger.entries()}
    assert {by_pid[i] for i in notices} == {new.pid}
    assert old.alive
    assert workers.tracebacks() == []
