"""The fault suite's own instruments catch what they are there to catch: the audit
trigger sees a done row change, the history sees claims, and the sampler sees a
connection idle in a transaction, too many connections, and a second LISTEN."""

from __future__ import annotations

import time
from contextlib import ExitStack

import psycopg
import pytest

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import (
    CONNECTIONS_PER_WORKER,
    Db,
    Sampler,
    claims,
    create_database,
    done_touched,
)
from tests.harness.app import WORK
from tests.harness.jobs import insert_jobs
from tests.harness.waiting import wait_until

FAKE_WORKER = 999_999  # a pid no worker of these tests has


def test_the_audit_trigger_records_any_update_of_a_done_row(server: ControlledPostgres) -> None:
    dsn = create_database(server, "audit", history=True)
    with Db(dsn) as db:
        [job_id] = insert_jobs(db.conn, WORK, [{}])
        db.conn.execute(
            "UPDATE asyncq_jobs SET status = 'running', attempts = 1, locked_by = 'h:42:x'"
            " WHERE id = %s",
            (job_id,),
        )
        db.conn.execute("UPDATE asyncq_jobs SET status = 'done' WHERE id = %s", (job_id,))
        assert done_touched(db) == []  # into done is fine
        db.conn.execute("UPDATE asyncq_jobs SET status = 'queued' WHERE id = %s", (job_id,))
        db.conn.execute("UPDATE asyncq_jobs SET status = 'done' WHERE id = %s", (job_id,))
        db.conn.execute("UPDATE asyncq_jobs SET finished_at = now() WHERE id = %s", (job_id,))
        touched = [(row[1], row[2], row[3]) for row in done_touched(db)]
        history = claims(db)
    assert touched == [(job_id, "done", "queued"), (job_id, "done", "done")]
    assert [(c.attempt, c.pid) for c in history[job_id]] == [(1, 42)]


def test_the_sampler_sees_idle_transactions_and_extra_connections(
    server: ControlledPostgres,
) -> None:
    dsn = create_database(server, "sampler")
    name = f"asyncq:{FAKE_WORKER}"
    with Sampler(server.dsn(), "sampler") as sampler, ExitStack() as stack:
        wait_until(lambda: sampler.samples > 10, 10, "a few samples")
        sampler.check()  # nothing yet

        idle = stack.enter_context(psycopg.connect(dsn, application_name=name))
        idle.execute("SELECT 1")  # and the transaction stays open
        time.sleep(sampler.idle_limit + 0.5)
        wait_until(lambda: sampler.idle_in_transaction, 5, "the idle transaction")
        idle.rollback()
        with pytest.raises(AssertionError, match="idle in a transaction"):
            sampler.check()
        sampler.idle_in_transaction.clear()

        for _ in range(2):
            conn = stack.enter_context(psycopg.connect(dsn, application_name=f"{name}:listener"))
            conn.execute("LISTEN somewhere")
        wait_until(lambda: sampler.max_listening.get(FAKE_WORKER) == 2, 5, "two LISTENs")
        with pytest.raises(AssertionError, match="more than one LISTEN"):
            sampler.check()
        sampler.max_listening.clear()

        for _ in range(CONNECTIONS_PER_WORKER - 2):
            stack.enter_context(psycopg.connect(dsn, application_name=name))
        wait_until(
            lambda: sampler.max_connections.get(FAKE_WORKER, 0) > CONNECTIONS_PER_WORKER,
            5,
            "more connections than a worker may have",
        )
        with pytest.raises(AssertionError, match="connections"):
            sampler.check()
