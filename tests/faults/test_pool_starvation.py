"""Heartbeats while running jobs hold every connection of the App's pool.

The heartbeat has its own small pool (the worker's control pool): jobs that hold the
main pool's connections, and jobs queued behind them for one, must not starve it,
or their leases lapse while they run and they run again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness.app import HOLD_CONNECTION
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

LEASE = 2
HOLD = 2.5 * LEASE


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def test_no_lease_is_lost_while_jobs_hold_every_pool_connection(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger
) -> None:
    # Two connections in the pool, four jobs at once: two hold the connections for two
    # and a half leases, two wait for them as long; the claim and the outcome writes
    # wait too.
    worker = workers.start("--concurrency", "4", lease=LEASE, env=workers.env(HARNESS_POOL_MAX="2"))
    ids = insert_jobs(db, HOLD_CONNECTION, [{"seconds": HOLD}] * 4)

    def finished() -> bool:
        (left,) = db.execute(
            "SELECT count(*) FROM asyncq_jobs"
            " WHERE id = ANY(%s) AND status IN ('queued', 'running')",
            (ids,),
        ).fetchone()
        return left == 0

    wait_until(finished, 4 * HOLD + 10, "the four jobs to finish")

    rows = db.execute(
        "SELECT id, status::text, attempts, last_error FROM asyncq_jobs WHERE id = ANY(%s)"
        " ORDER BY id",
        (ids,),
    ).fetchall()
    assert rows == [(job_id, "done", 1, None) for job_id in ids]
    for job_id in ids:
        assert [e.event for e in ledger.entries() if e.job_id == job_id] == [
            "start",
            "got_connection",
            "end",
        ]
    # The pool really ran dry for longer than a lease: two jobs waited that long.
    waits = sorted(
        ledger.events("got_connection", job_id)[0].at - ledger.events("start", job_id)[0].at
        for job_id in ids
    )
    assert waits[2] > LEASE and waits[3] > LEASE, waits
    log = worker.stderr()
    assert "lease lost" not in log
    assert "stopped renewing" not in log
    assert "heartbeat failed" not in log
    assert worker.alive
