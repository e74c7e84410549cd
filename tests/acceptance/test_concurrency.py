"""Eight worker processes claiming from one table never run the same job twice; a
worker with two claims in flight never holds more jobs than its concurrency."""

from __future__ import annotations

import signal
import time
from collections import Counter

from tests.harness.app import NOOP, SLEEP
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

JOBS = 2000
PROCESSES = 8


def test_eight_workers_never_claim_the_same_job(db, workers: Workers, ledger: Ledger) -> None:
    # A long lease: a job must run twice here only if two workers claimed it, never
    # because a heartbeat came late on a busy machine.
    # Half of them run two claim loops (their slots hold two batches).
    procs = [
        workers.start(
            "--concurrency", "10", "--batch-size", "10" if n % 2 else "5", lease=30, ready=False
        )
        for n in range(PROCESSES)
    ]
    for proc in procs:
        proc.wait_ready()

    # All eight are listening: one INSERT wakes them together.
    ids = insert_jobs(db, NOOP, [{"n": n} for n in range(JOBS)])
    assert len(ids) == JOBS

    def all_done() -> bool:
        (done,) = db.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'").fetchone()
        return done == JOBS

    wait_until(all_done, 60, f"{JOBS} jobs done")
    for proc in procs:
        proc.send(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(15) == 0, proc.stderr()

    starts = Counter(e.job_id for e in ledger.events("start"))
    ends = Counter(e.job_id for e in ledger.events("end"))
    twice = sorted(job_id for job_id, n in starts.items() if n > 1)
    assert not twice, f"{len(twice)} jobs ran more than once, e.g. {twice[:10]}"
    assert set(starts) == set(ids)
    assert set(ends) == set(ids) and set(ends.values()) == {1}

    rows = db.execute(
        "SELECT status::text, attempts, count(*) FROM asyncq_jobs GROUP BY 1, 2"
    ).fetchall()
    assert rows == [("done", 1, JOBS)]

    # The claims really were concurrent: the work was spread over the processes.
    pids = Counter(e.pid for e in ledger.events("start"))
    assert len(pids) >= PROCESSES // 2, pids
    (owners,) = db.execute("SELECT count(DISTINCT locked_by) FROM asyncq_jobs").fetchone()
    assert owners == len(pids)
    for proc in procs:
        assert "lease lost" not in proc.stderr()


def test_two_claims_in_flight_hold_no_more_jobs_than_the_concurrency(
    db, workers: Workers, ledger: Ledger
) -> None:
    # Concurrency 8 in batches of 4: two claim loops, each taking its slots before it
    # claims. Jobs that outlast the test keep every slot taken.
    ids = insert_jobs(db, SLEEP, [{"seconds": 30}] * 40)
    proc = workers.start("--concurrency", "8", "--batch-size", "4", "--grace", "0", lease=30)

    def running() -> int:
        (n,) = db.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'running'").fetchone()
        return int(n)

    wait_until(lambda: running() >= 8, 20, "eight jobs running")
    # Both loops have claimed again and again by now, had their slots been free.
    wait_until(lambda: len(ledger.events("start")) >= 8, 10, "eight jobs started")
    for _ in range(10):
        assert running() == 8
        time.sleep(0.1)
    assert len(ledger.events("start")) == 8
    proc.send(signal.SIGTERM)
    assert proc.wait(15) == 0, proc.stderr()
    (queued,) = db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE status = 'queued' AND id = ANY(%s)", (ids,)
    ).fetchone()
    assert queued == 40
