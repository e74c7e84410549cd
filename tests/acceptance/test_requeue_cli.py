"""``asyncq requeue``: failed jobs back to the queue by id, queue, task or all of them;
other jobs refused with a reason and exit status 1; two at once requeue a job once."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import psycopg

from tests.harness.app import APP
from tests.harness.jobs import insert_jobs, job_row
from tests.harness.ledger import Ledger
from tests.harness.processes import REPO, Workers
from tests.harness.waiting import wait_until

FIX = "guarded.until_fixed"
FIX_TOO = "guarded.until_fixed_too"


def drain(workers: Workers, *, fixed: bool) -> None:
    env = workers.env(HARNESS_FIXED="1" if fixed else "0")
    result = workers.cli("worker", APP, "--drain", env=env)
    assert result.returncode == 0, result.stderr


def requeue(workers: Workers, *args: str) -> subprocess.CompletedProcess[str]:
    return workers.cli("requeue", APP, *args)


def said(stderr: str) -> list[str]:
    """The command's own lines on stderr, without the log lines."""
    return [line for line in stderr.splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]


def state(db: Any, job_id: int) -> tuple[str, int]:
    row = job_row(db, job_id)
    return (row["status"], row["attempts"])


def test_requeue_by_id_then_a_worker_runs_them_to_done(
    db: Any, workers: Workers, ledger: Ledger
) -> None:
    ids = insert_jobs(db, FIX, [{}, {}, {}], max_attempts=1)
    drain(workers, fixed=False)
    assert [state(db, i) for i in ids] == [("failed", 1)] * 3

    result = requeue(workers, str(ids[0]), str(ids[1]))

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"requeued 2 jobs: {ids[0]} {ids[1]}\n"
    assert [state(db, i) for i in ids] == [("queued", 0), ("queued", 0), ("failed", 1)]
    drain(workers, fixed=True)
    assert [state(db, i) for i in ids] == [("done", 1), ("done", 1), ("failed", 1)]
    assert sorted(e.job_id for e in ledger.events("end")) == ids[:2]


def test_requeue_refuses_done_running_queued_and_unknown_jobs(db: Any, workers: Workers) -> None:
    [done] = insert_jobs(db, "guarded.ok", [{}], status="done", attempts=1)
    [running] = insert_jobs(db, "guarded.ok", [{}], status="running", attempts=1)
    [queued] = insert_jobs(db, "guarded.ok", [{}])
    [failed] = insert_jobs(db, FIX, [{}], status="failed", attempts=3)
    unknown = failed + 1000

    alone = requeue(workers, str(done))
    assert alone.returncode == 1
    assert alone.stdout == "requeued 0 jobs\n"
    assert said(alone.stderr) == [
        f"job {done} not requeued: done: only failed or cancelled jobs can be requeued"
    ]

    mixed = requeue(workers, str(done), str(running), str(queued), str(failed), str(unknown))
    assert mixed.returncode == 1
    assert mixed.stdout == f"requeued 1 jobs: {failed}\n"
    assert said(mixed.stderr) == [
        f"job {done} not requeued: done: only failed or cancelled jobs can be requeued",
        f"job {running} not requeued: running: only failed or cancelled jobs can be requeued",
        f"job {queued} not requeued: already queued",
        f"job {unknown} not requeued: no such job",
    ]
    assert [state(db, i) for i in (done, running, queued, failed)] == [
        ("done", 1),
        ("running", 1),
        ("queued", 0),
        ("queued", 0),
    ]

    for args in ([str(done), "--all-failed"], []):
        error = requeue(workers, *args)
        assert error.returncode == 2, error
        assert said(error.stderr)[-1].startswith("asyncq: error: ")
        assert "Traceback" not in error.stderr


def test_requeue_by_queue_by_task_and_all_failed(db: Any, workers: Workers, ledger: Ledger) -> None:
    [a] = insert_jobs(db, FIX, [{}], queue="qa", max_attempts=1)
    [b] = insert_jobs(db, FIX, [{}], queue="qb", max_attempts=1)
    [c] = insert_jobs(db, FIX_TOO, [{}], queue="qa", max_attempts=1)
    [d] = insert_jobs(db, FIX_TOO, [{}], queue="qc", max_attempts=1)
    [cancelled] = insert_jobs(db, FIX, [{}], status="cancelled", queue="qa")
    drain(workers, fixed=False)
    assert [state(db, i)[0] for i in (a, b, c, d)] == ["failed"] * 4

    def queued() -> list[int]:
        return [i for i in (a, b, c, d) if state(db, i) == ("queued", 0)]

    by_queue = requeue(workers, "--queue", "qb")
    assert (by_queue.returncode, by_queue.stdout) == (0, f"requeued 1 jobs: {b}\n")
    assert queued() == [b]
    by_task = requeue(workers, "--task", FIX_TOO)
    assert (by_task.returncode, by_task.stdout) == (0, f"requeued 2 jobs: {c} {d}\n")
    assert queued() == [b, c, d]
    everything = requeue(workers, "--all-failed")
    assert (everything.returncode, everything.stdout) == (0, f"requeued 1 jobs: {a}\n")
    assert queued() == [a, b, c, d]
    nothing = requeue(workers, "--all-failed")
    assert (nothing.returncode, nothing.stdout, said(nothing.stderr)) == (
        0,
        "requeued 0 jobs\n",
        [],
    )
    assert state(db, cancelled) == ("cancelled", 0)  # filters take failed jobs only

    drain(workers, fixed=True)
    assert [state(db, i) for i in (a, b, c, d)] == [("done", 1)] * 4
    assert sorted(e.job_id for e in ledger.events("end")) == [a, b, c, d]


def test_two_requeues_at_once_requeue_the_job_once_and_it_runs_once(
    db: Any, dsn: str, workers: Workers, ledger: Ledger
) -> None:
    [job_id] = insert_jobs(db, FIX, [{}], max_attempts=1)
    drain(workers, fixed=False)
    assert state(db, job_id) == ("failed", 1)
    before = ledger.mark("requeue")

    with psycopg.connect(dsn) as blocker:
        # Hold the row, so that both commands wait on it and go on at the same moment.
        blocker.execute("SELECT 1 FROM asyncq_jobs WHERE id = %s FOR UPDATE", (job_id,))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "asyncq", "requeue", APP, str(job_id)],
                env=workers.env(),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        try:
            wait_until(lambda: lock_waiters(db) == 2, 20, "both requeues to wait on the row")
        finally:
            blocker.commit()
        outputs = sorted((p.wait(30), *p.communicate()) for p in procs)

    winner, loser = outputs
    assert winner[:2] == (0, f"requeued 1 jobs: {job_id}\n")
    assert loser[:2] == (1, "requeued 0 jobs\n")
    assert said(loser[2]) == [f"job {job_id} not requeued: already queued"]
    assert state(db, job_id) == ("queued", 0)
    drain(workers, fixed=True)
    assert state(db, job_id) == ("done", 1)
    runs = [e for e in ledger.events("start", job_id) if e.index > before.index]
    assert len(runs) == 1


def lock_waiters(db: Any) -> int:
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0])
