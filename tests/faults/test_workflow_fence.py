"""A worker frozen (SIGSTOP) past its lease while another takes its job over writes
nothing of the job's workflow once continued: no step result, no ``step_tx`` SQL, no
sleep, no wait, no child.

The job's first run stops its own worker just before the write (inside the step, after
its side effect, for the steps), so that, continued, the write is the first thing the
worker does. The frozen worker's lease is long (its heartbeat and its self-fence are
not due while it is stopped) and the test lets it lapse with SQL, as if the worker had
been stopped for longer: the fence of the write is then all that stands in the way. A
second worker (lease 2 s) takes the job back and runs it to a gate before the same
write; the first is continued there, and its write must be refused (its log says so)
and change nothing. Then the gate opens, and the second run writes, once.
"""

from __future__ import annotations

import signal
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
    sessions,
    workflow_database,
)
from tests.harness.app import WF_CHILD, WF_FENCED
from tests.harness.jobs import insert_jobs
from tests.harness.waiting import wait_until

# What the refused write's log line says it was, and the checkpoint it would have made.
KINDS = {
    "step": ("before its step 'x' was recorded", "x"),
    "step_tx": ("before its step 'book' was recorded", "book"),
    "sleep": ("before a sleep was recorded", "asyncq.sleep"),
    "wait": ("before a wait for the event 'wf-fence' was recorded", "asyncq.wait:wf-fence"),
    "spawn": (f"before its children of {WF_CHILD} were written", f"asyncq.spawn:{WF_CHILD}"),
}
KEY = "wf-fence"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lapse", ["expired", "lapsed"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_frozen_worker_writes_nothing_once_its_job_is_taken_over(
    kind: str, lapse: str, server: ControlledPostgres, tmp_path: Path
) -> None:
    """``expired``: the frozen worker's lease is 600 s, made to run out with SQL; its
    write is refused by its fence. ``lapsed``: its lease is 2 s and runs out while it is
    stopped; continued, its self-fence stops the attempt (0.8 of a lease after its last
    renewal) unless the write's fence refused it first: either way nothing is written."""
    why, step = KINDS[kind]
    dsn = workflow_database(server, f"wf_fence_{kind}_{lapse}")
    workers = fault_workers(dsn, tmp_path)
    gate = tmp_path / "gate"
    try:
        with Db(dsn) as db:
            frozen = workers.start(lease=600 if lapse == "expired" else 2)
            [job_id] = insert_jobs(
                db.conn, WF_FENCED, [{"kind": kind, "gate": str(gate), "key": KEY}]
            )
            wait_until(lambda: process_state(frozen.pid) == "T", 20, "the worker to stop itself")
            assert checkpoints(db, job_id) == {}
            if lapse == "expired":
                db.rows(
                    "UPDATE asyncq_jobs SET expires_at = now() - interval '1 second'"
                    " WHERE id = %s RETURNING id",
                    job_id,
                )

            other = workers.start(lease=2)
            wait_until(lambda: count(workers.ledger, "gate", job_id), 20, "the second run")
            taken = job(db, job_id)
            assert (taken["status"], taken["claims"]) == ("running", 2)
            assert taken["locked_by"] == other.worker_id

            frozen.send(signal.SIGCONT)
            refused = f"job {job_id}: lease lost during attempt 1 ({why})"
            stopped = f"job {job_id} ({WF_FENCED}): lease not renewed for"

            def answered() -> bool:
                return (
                    refused in frozen.stderr()
                    or (lapse == "lapsed" and stopped in frozen.stderr())
                    or job(db, job_id) != taken
                    or bool(checkpoints(db, job_id) or effects(db, job_id) or children(db, job_id))
                )

            wait_until(answered, 10, "the frozen worker's write to be answered")
            wait_until(
                lambda: all(state != "active" for _, state, _, _ in sessions(db, frozen.pid)),
                10,
                "no statement of the frozen worker's in flight",
            )
            assert job(db, job_id) == taken
            assert checkpoints(db, job_id) == {}
            assert effects(db, job_id) == []
            assert children(db, job_id) == []
            if lapse == "expired":
                assert refused in frozen.stderr()

            if kind == "wait":
                db.rows("SELECT asyncq_emit_event(%s, %s)", KEY, '"emitted"')
            gate.touch()
            wait_until(lambda: job(db, job_id)["status"] == "done", 30, "the job to be done")
            row = job(db, job_id)
            written = checkpoints(db, job_id)
            assert set(written) == {step}
            assert written[step] == 2, written
            expected = {
                "step": {"claim": 2},
                "step_tx": {"claim": 2},
                "sleep": "slept",
                "wait": "emitted",
                "spawn": [1, 2],
            }
            assert row["result"] == expected[kind]
            if kind == "step_tx":
                assert effects(db, job_id) == [2]
            if kind in ("step", "step_tx"):
                assert count(workers.ledger, f"step:{step}", job_id) == 2
            assert len(children(db, job_id)) == (2 if kind == "spawn" else 0)
            assert frozen.alive
            assert not done_touched(db)
            assert not workers.tracebacks(), workers.tracebacks()
    finally:
        workers.kill_all()
