"""Fan-in under contention: many children of one parent ending at once on several worker
processes wake the parent exactly once, by the end of its last child (not by the
maintenance sweep); and a child ended by a statement that releases no waiter (plain
SQL, as a worker of an earlier version would) leaves its parent to the sweep, which
wakes it.

Each child ends in its worker's outcome write (``asyncq_mark_done_results``), which
removes its edges and wakes the parent once none is left (``asyncq_wake_waiters``); of
two such writes on two workers that remove a parent's last two edges at once, the one
that takes the parent's lock second must see the other's removal. Every wake-up is
recorded with the statement that made it (`tests.faults.workflows.WAKES`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import Db, done_touched, fault_workers, figures
from tests.faults.workflows import children, job, wakes, workflow_database
from tests.harness.app import WF_PARENT
from tests.harness.jobs import insert_jobs
from tests.harness.waiting import wait_until

__all__ = ["figures"]  # fixtures

WORKERS = 3
CONCURRENCY = 16
ROUNDS = 20
PARENTS = 8  # each round
CHILDREN = 5  # each parent's
SWEEP = 10.0  # asyncq.worker.settings: wakeups_interval
# Each worker claims only what it runs, and claims whenever a slot is free (a worker
# busy with long jobs otherwise waits for half a batch of free slots): every child of a
# round runs at once, on the three workers.
OPTIONS = ("--concurrency", str(CONCURRENCY), "--prefetch", "0", "--batch-size", "2")


def woken_by(query: str) -> str:
    for name in ("asyncq_mark_done", "asyncq_wake_lost", "asyncq_wake_due"):
        if name in query:
            return name
    return query


@pytest.mark.timeout(600)
def test_children_ending_at_once_on_several_workers_wake_their_parent_once(
    server: ControlledPostgres,
    tmp_path: Path,
    figures: Callable[[str, dict[str, Any]], None],
) -> None:
    """20 rounds; each, 8 parents of 5 children each (40 children, held at one gate, spread
    over 3 workers of 16 slots); once every parent waits, the gate opens and the 40
    children end within a few milliseconds of each other."""
    dsn = workflow_database(server, "wf_fan_in")
    workers = fault_workers(dsn, tmp_path)
    try:
        with Db(dsn) as db:
            procs = [workers.start(*OPTIONS, lease=10, ready=False) for _ in range(WORKERS)]
            for proc in procs:
                proc.wait_ready(30)
            parents: list[int] = []
            stuck: list[float] = []  # how long a round's last parent took to wake, past 2 s
            for round_ in range(ROUNDS):
                gate = tmp_path / f"gate-{round_}"
                ids = insert_jobs(db.conn, WF_PARENT, [{"gates": [str(gate)] * CHILDREN}] * PARENTS)
                parents += ids

                def at_gate(ids: list[int] = ids) -> bool:
                    held: int = db.value(
                        "SELECT count(*) FROM asyncq_jobs WHERE parent_id = ANY(%s)"
                        " AND status = 'running'",
                        ids,
                    )
                    waiting: int = db.value(
                        "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s)"
                        " AND status = 'waiting'",
                        ids,
                    )
                    gated = len(
                        {e.job_id for e in workers.ledger.events("gate")}
                        & {c for p in ids for c in children(db, p)}
                    )
                    return held == gated == PARENTS * CHILDREN and waiting == PARENTS

                wait_until(
                    at_gate, 60, f"round {round_}: every child at the gate, every parent waiting"
                )
                opened = time.monotonic()
                gate.touch()

                def ended(ids: list[int] = ids) -> bool:
                    return all(job(db, p)["status"] == "done" for p in ids)

                wait_until(ended, SWEEP * 3 + 30, f"round {round_}: every parent done")
                stuck.append(time.monotonic() - opened)

            by: Counter[str] = Counter()
            problems = []
            ran = workers.ledger.by_job()
            for parent in parents:
                row = job(db, parent)
                if row["result"] != list(range(CHILDREN)):
                    problems.append(f"parent {parent}: result {row['result']}")
                found = wakes(db, parent)
                by.update(woken_by(q) for _, _, q in found)
                if [(s, c, woken_by(q)) for s, c, q in found] != [
                    ("queued", 1, "asyncq_mark_done")
                ]:
                    problems.append(f"parent {parent}: woken {found}")
                starts = [e for e in ran[parent] if e.event == "start"]
                if len(starts) != 2:
                    problems.append(f"parent {parent}: {len(starts)} runs")
                for child in children(db, parent):
                    events = [e.event for e in ran[child]]
                    if events != ["start", "gate", "end"]:
                        problems.append(f"child {child} of {parent}: {events}")
            figures(
                "workflow_fan_in",
                {
                    "workers": WORKERS,
                    "parents": len(parents),
                    "children_each": CHILDREN,
                    "woken_by": dict(by),
                    "slowest_round_s": round(max(stuck), 3),
                },
            )
            assert not problems, "\n".join(problems[:20])
            assert not db.rows("SELECT * FROM asyncq_waits")
            assert not done_touched(db)
            assert not workers.tracebacks(), workers.tracebacks()
    finally:
        workers.kill_all()


@pytest.mark.timeout(120)
def test_a_child_ended_by_plain_sql_leaves_its_parent_to_the_sweep(
    server: ControlledPostgres, tmp_path: Path
) -> None:
    """Two children in a queue no worker serves; the parent waits for them. The test ends
    both with a plain UPDATE (no waiter released: their edges stay). The maintenance
    sweep finds the edges to ended jobs, releases them and wakes the parent, once; the
    parent gathers the results the UPDATE wrote."""
    dsn = workflow_database(server, "wf_plain_sql")
    workers = fault_workers(dsn, tmp_path)
    try:
        with Db(dsn) as db:
            workers.start("--queue", "default", lease=4)
            [parent] = insert_jobs(db.conn, WF_PARENT, [{"gates": ["", ""], "queue": "elsewhere"}])
            wait_until(lambda: job(db, parent)["status"] == "waiting", 20, "the parent to wait")
            kids = sorted(children(db, parent))
            assert len(db.rows("SELECT * FROM asyncq_waits WHERE job_id = %s", parent)) == 2
            db.rows(
                "UPDATE asyncq_jobs SET status = 'done', finished_at = now(),"
                " result = to_jsonb(array_position(%s::bigint[], id) - 1)"
                " WHERE id = ANY(%s) RETURNING id",
                kids,
                kids,
            )
            wait_until(
                lambda: job(db, parent)["status"] == "done",
                SWEEP * 2 + 20,
                "the sweep to wake the parent, and the parent to end",
            )
            assert job(db, parent)["result"] == [0, 1]
            [(status, claims, query)] = wakes(db, parent)
            assert (status, claims, woken_by(query)) == ("queued", 1, "asyncq_wake_lost")
            assert not db.rows("SELECT * FROM asyncq_waits")
            assert not done_touched(db)
            assert not workers.tracebacks(), workers.tracebacks()
    finally:
        workers.kill_all()
