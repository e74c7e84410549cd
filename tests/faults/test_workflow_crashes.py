"""Workflows through ``kill -9`` and a server restart: no step runs again once its
checkpoint is written, a ``step_tx``'s own SQL commits once, no child is spawned twice,
and no parent is left waiting.

Each kill falls at a known point: the job's first run stops its own worker (SIGSTOP,
`tests.harness.app`) inside a step or between ``spawn_many`` and the gather, and the
test sends the SIGKILL; or the test holds the job's row (or the parent's) locked, so
that the worker's checkpoint or the child's end waits in the server, and kills the
worker while it waits. Killed there, the statement either goes on and commits (its
answer lost) or, with ``client_connection_check_interval``, is cut short and rolls
back: each case is a test. A second worker takes the job back once its lease (4 s)
runs out. The ledger counts every run of every step.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import Db, done_touched, fault_workers, process_state
from tests.faults.workflows import (
    checkpoints,
    children,
    count,
    effects,
    job,
    rows_locked,
    sessions,
    waiting_for_a_lock,
    wakes,
    workflow_database,
)
from tests.harness.app import WF_CHILD, WF_PARENT, WF_SLEEPER, WF_STEP_TX, WF_STEPS
from tests.harness.jobs import insert_jobs
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until

LEASE = 4


def stopped(worker: WorkerProcess) -> None:
    wait_until(lambda: process_state(worker.pid) == "T", 20, "the worker to stop itself")


def killed(workers: Workers, db: Db, worker: WorkerProcess) -> None:
    """``kill -9``, then wait until the server has ended every session of the worker."""
    workers.kill9(worker)
    wait_until(lambda: not sessions(db, worker.pid), 20, "the dead worker's sessions to end")


def done(db: Db, job_id: int, within: float = 40) -> dict[str, object]:
    wait_until(lambda: job(db, job_id)["status"] == "done", within, f"job {job_id} to be done")
    return job(db, job_id)


def clean(workers: Workers, db: Db) -> None:
    assert not done_touched(db)
    assert not workers.tracebacks(), workers.tracebacks()
    assert not db.rows("SELECT * FROM asyncq_waits")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["in_step", "checkpoint_committed", "checkpoint_rolled_back"])
def test_a_step_runs_again_only_if_its_checkpoint_was_not_written(
    where: str, server: ControlledPostgres, tmp_path: Path
) -> None:
    """Steps a, b, c; the worker is killed after a's checkpoint, in b: inside b (after its
    side effect), or while b's checkpoint waits in the server. a never runs again; b runs
    again exactly when its checkpoint did not commit; c runs once."""
    dsn = workflow_database(
        server, f"wf_steps_{where}", check_client=where == "checkpoint_rolled_back"
    )
    workers = fault_workers(dsn, tmp_path)
    gate = tmp_path / "gate"
    try:
        with Db(dsn) as db:
            first = workers.start(lease=LEASE)
            if where == "in_step":
                [job_id] = insert_jobs(db.conn, WF_STEPS, [{"stop_in": "b"}])
                stopped(first)
                assert checkpoints(db, job_id) == {"a": 1}
                killed(workers, db, first)
            else:
                [job_id] = insert_jobs(db.conn, WF_STEPS, [{"gate": str(gate)}])
                wait_until(lambda: count(workers.ledger, "gate", job_id), 20, "the job at its gate")
                with rows_locked(dsn, [job_id]):
                    gate.touch()
                    wait_until(
                        lambda: waiting_for_a_lock(db, first.pid, "asyncq_write_steps"),
                        20,
                        "b's checkpoint to wait for the row",
                    )
                    workers.kill9(first)
                    if where == "checkpoint_rolled_back":
                        wait_until(lambda: not sessions(db, first.pid), 20, "its sessions to end")
                wait_until(lambda: not sessions(db, first.pid), 20, "its sessions to end")
            written_before = checkpoints(db, job_id)
            assert written_before == (
                {"a": 1, "b": 1} if where == "checkpoint_committed" else {"a": 1}
            )
            assert count(workers.ledger, "step:b", job_id) == 1

            workers.start(lease=LEASE)
            row = done(db, job_id)
            b_by = written_before.get("b", 2)
            assert row["result"] == [{"claim": 1}, {"claim": b_by}, {"claim": 2}]
            assert row["claims"] == 2
            assert checkpoints(db, job_id) == {"a": 1, "b": b_by, "c": 2}
            assert count(workers.ledger, "step:a", job_id) == 1
            assert count(workers.ledger, "step:b", job_id) == (1 if b_by == 1 else 2)
            assert count(workers.ledger, "step:c", job_id) == 1
            clean(workers, db)
    finally:
        workers.kill_all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["in_step", "checkpoint"])
def test_a_step_tx_commits_its_sql_once(
    where: str, server: ControlledPostgres, tmp_path: Path
) -> None:
    """The worker is killed inside a ``step_tx`` (its row inserted, not committed), or
    while the step's checkpoint, last in its transaction, waits in the server (the COMMIT
    never comes). Neither the row nor the checkpoint commits; the next run does both,
    once."""
    dsn = workflow_database(server, f"wf_step_tx_{where}")
    workers = fault_workers(dsn, tmp_path)
    gate = tmp_path / "gate"
    try:
        with Db(dsn) as db:
            first = workers.start(lease=LEASE)
            if where == "in_step":
                [job_id] = insert_jobs(db.conn, WF_STEP_TX, [{"stop_in": True}])
                stopped(first)
                killed(workers, db, first)
            else:
                [job_id] = insert_jobs(db.conn, WF_STEP_TX, [{"gate": str(gate)}])
                wait_until(lambda: count(workers.ledger, "gate", job_id), 20, "the job at its gate")
                with rows_locked(dsn, [job_id]):
                    gate.touch()
                    wait_until(
                        lambda: waiting_for_a_lock(
                            db, first.pid, "asyncq_write_step_in_transaction"
                        ),
                        20,
                        "the step's checkpoint to wait for the row",
                    )
                    workers.kill9(first)
                wait_until(lambda: not sessions(db, first.pid), 20, "its sessions to end")
            assert count(workers.ledger, "step:book", job_id) == 1
            assert effects(db, job_id) == []
            assert checkpoints(db, job_id) == {}

            workers.start(lease=LEASE)
            row = done(db, job_id)
            assert row["result"] == {"claim": 2}
            assert effects(db, job_id) == [2]
            assert checkpoints(db, job_id) == {"book": 2}
            assert count(workers.ledger, "step:book", job_id) == 2
            clean(workers, db)
    finally:
        workers.kill_all()


@pytest.mark.timeout(120)
def test_children_are_spawned_once_when_killed_between_the_spawn_and_the_wait(
    server: ControlledPostgres, tmp_path: Path
) -> None:
    """``spawn_many`` wrote 3 children (in a queue the killed worker does not serve), and
    the worker dies before the gather suspends the parent. The next run gets the same
    ids from the spawn's checkpoint, writes no child, and waits for them (held at their
    gate until it does)."""
    dsn = workflow_database(server, "wf_spawn_kill")
    workers = fault_workers(dsn, tmp_path)
    gate = tmp_path / "gate"
    try:
        with Db(dsn) as db:
            first = workers.start("--queue", "default", lease=LEASE)
            gates = [str(gate)] * 3
            [parent] = insert_jobs(
                db.conn, WF_PARENT, [{"gates": gates, "queue": "kids", "stop": True}]
            )
            stopped(first)
            spawned = sorted(children(db, parent))
            assert len(spawned) == 3
            assert checkpoints(db, parent) == {f"asyncq.spawn:{WF_CHILD}": 1}
            assert job(db, parent)["status"] == "running"
            killed(workers, db, first)

            workers.start(lease=LEASE)
            wait_until(lambda: job(db, parent)["status"] == "waiting", 20, "the parent to wait")
            gate.touch()
            row = done(db, parent)
            assert row["result"] == [0, 1, 2]
            assert sorted(children(db, parent)) == spawned
            assert count(workers.ledger, "spawned", parent) == 3  # claims 1, 2 and 3
            for child in spawned:
                assert job(db, child)["status"] == "done"
                assert count(workers.ledger, "start", child) == 1
                assert count(workers.ledger, "end", child) == 1
            # Claim 2 (after the kill) suspended the parent; the last child's end woke it.
            [(status, _, woken_by)] = wakes(db, parent)
            assert status == "queued"
            assert "asyncq_mark_done" in woken_by
            clean(workers, db)
    finally:
        workers.kill_all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("outcome", ["committed", "rolled_back"])
def test_a_parent_is_woken_once_when_its_last_child_is_killed_ending(
    outcome: str, server: ControlledPostgres, tmp_path: Path
) -> None:
    """Three children; two end, the parent waits for the third. The test holds the
    parent's row, so the third child's end waits in the server to wake it, and the
    worker is killed then. Committed: the child is done and the parent woken by that
    statement, though its worker is dead. Rolled back: the child runs again elsewhere
    once its lease runs out, and its end there wakes the parent. Either way the parent
    is woken once, by a child's end (not the maintenance sweep), and runs to its end."""
    dsn = workflow_database(
        server, f"wf_last_child_{outcome}", check_client=outcome == "rolled_back"
    )
    workers = fault_workers(dsn, tmp_path)
    gate = tmp_path / "gate"
    try:
        with Db(dsn) as db:
            first = workers.start(lease=LEASE)
            [parent] = insert_jobs(db.conn, WF_PARENT, [{"gates": ["", "", str(gate)]}])
            wait_until(lambda: len(children(db, parent)) == 3, 20, "the children")
            kids = sorted(children(db, parent))
            last = kids[-1]
            wait_until(
                lambda: count(workers.ledger, "gate", last), 20, "the last child at its gate"
            )
            wait_until(
                lambda: [job(db, k)["status"] for k in kids[:2]] == ["done", "done"],
                20,
                "the first two children to end",
            )
            wait_until(lambda: job(db, parent)["status"] == "waiting", 20, "the parent to wait")
            with rows_locked(dsn, [parent]):
                gate.touch()
                wait_until(
                    lambda: waiting_for_a_lock(db, first.pid, "asyncq_mark_done"),
                    20,
                    "the last child's end to wait for the parent's row",
                )
                workers.kill9(first)
                if outcome == "rolled_back":
                    wait_until(lambda: not sessions(db, first.pid), 20, "its sessions to end")
            wait_until(lambda: not sessions(db, first.pid), 20, "its sessions to end")
            expected = {"committed": ("done", "queued"), "rolled_back": ("running", "waiting")}
            assert (job(db, last)["status"], job(db, parent)["status"]) == expected[outcome]

            workers.start(lease=LEASE)
            row = done(db, parent)
            assert row["result"] == [0, 1, 2]
            assert row["claims"] == 2
            assert sorted(children(db, parent)) == kids
            assert count(workers.ledger, "start", parent) == 2
            assert count(workers.ledger, "end", last) == (1 if outcome == "committed" else 2)
            [(status, claims, woken_by)] = wakes(db, parent)
            assert (status, claims) == ("queued", 1)
            assert "asyncq_mark_done" in woken_by, woken_by
            clean(workers, db)
    finally:
        workers.kill_all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["restart", "outage_past_its_end"])
def test_a_sleep_ends_after_a_server_restart(
    fault: str, server: ControlledPostgres, tmp_path: Path
) -> None:
    """Step a, a durable sleep, step b; the server restarts during the sleep (``pg_ctl
    restart -m fast``), or is stopped until after the sleep's end and started again.
    The job wakes once, a and b run once each."""
    dsn = workflow_database(server, f"wf_sleep_{fault}")
    workers = fault_workers(dsn, tmp_path)
    seconds = 4.0 if fault == "restart" else 2.0
    try:
        with Db(dsn) as db:
            worker = workers.start(lease=LEASE)
            [job_id] = insert_jobs(db.conn, WF_SLEEPER, [{"seconds": seconds}])
            wait_until(lambda: job(db, job_id)["status"] == "waiting", 20, "the job to sleep")
            if fault == "restart":
                server.restart("fast")
            else:
                due = db.value(
                    "SELECT extract(epoch FROM run_at)::float8 FROM asyncq_jobs WHERE id = %s",
                    job_id,
                )
                server.stop("fast")
                wait_until(lambda: time.time() > due + 1, 20, "the sleep's end to pass")
                server.start()
            db.close()
            row = done(db, job_id, within=60)
            assert row["result"] == [{"claim": 1}, {"claim": 2}]
            assert row["claims"] == 2
            assert count(workers.ledger, "step:a", job_id) == 1
            assert count(workers.ledger, "step:b", job_id) == 1
            [(status, _, woken_by)] = wakes(db, job_id)
            assert status == "queued"
            assert "asyncq_wake_due" in woken_by
            assert worker.alive
            clean(workers, db)
    finally:
        workers.kill_all()
