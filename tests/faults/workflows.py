"""What the workflow fault tests add to `tests.faults.support`: a database with a record of
every wake-up of a waiting job (which statement woke it), the table of the harness's
``step_tx`` steps, looks at a worker's server sessions, and a row lock the test holds to
catch a worker's statement in flight."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import Db, create_database
from tests.harness.ledger import Ledger

# Every job leaving 'waiting', with the statement that moved it (current_query() is the
# client's top-level statement: asyncq_mark_done... for a child's end that released its
# waiter, asyncq_wake_lost for the maintenance sweep, asyncq_wake_due for a sleep's end).
WAKES = """
CREATE TABLE faults_wakes (
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    id         bigint NOT NULL,
    new_status text NOT NULL,
    claims     bigint NOT NULL,
    query      text
);
CREATE FUNCTION faults_wakes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO faults_wakes (id, new_status, claims, query)
    VALUES (NEW.id, NEW.status, NEW.claims, left(current_query(), 200));
    RETURN NULL;
END
$$;
CREATE TRIGGER faults_wakes AFTER UPDATE OF status ON asyncq_jobs
    FOR EACH ROW WHEN (OLD.status = 'waiting' AND NEW.status <> 'waiting')
    EXECUTE FUNCTION faults_wakes();
CREATE TABLE wf_effects (
    job_id bigint NOT NULL,
    claim  bigint NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def workflow_database(server: ControlledPostgres, name: str, *, check_client: bool = False) -> str:
    """A database of `create_database` (with the status history) and the wake-up record.
    ``check_client``: its sessions look for a lost client every 100 ms while a statement
    runs (``client_connection_check_interval``), so that a statement in flight when its
    worker is killed is cut short and rolls back, a lock wait included; without it, the
    statement goes on and commits, and only its answer is lost."""
    dsn = create_database(server, name, history=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(WAKES)
        if check_client:
            conn.execute(f'ALTER DATABASE "{name}" SET client_connection_check_interval = 100')
    return dsn


def wakes(db: Db, job_id: int) -> list[tuple[str, int, str]]:
    """(new status, claims, statement) of each time ``job_id`` left 'waiting'."""
    return [
        (r[0], r[1], r[2])
        for r in db.rows(
            "SELECT new_status, claims, query FROM faults_wakes WHERE id = %s ORDER BY at", job_id
        )
    ]


def checkpoints(db: Db, job_id: int) -> dict[str, int]:
    """The steps recorded for ``job_id`` (name, and seq when more than 1), by the claim
    that recorded each."""
    rows = db.rows("SELECT name, seq, claim FROM asyncq_steps WHERE job_id = %s", job_id)
    return {(name if seq == 1 else f"{name}#{seq}"): claim for name, seq, claim in rows}


def effects(db: Db, job_id: int) -> list[int]:
    """The claims whose ``step_tx`` rows in ``wf_effects`` committed."""
    return [r[0] for r in db.rows("SELECT claim FROM wf_effects WHERE job_id = %s", job_id)]


def children(db: Db, parent_id: int) -> list[int]:
    return [r[0] for r in db.rows("SELECT id FROM asyncq_jobs WHERE parent_id = %s", parent_id)]


def job(db: Db, job_id: int) -> dict[str, Any]:
    row = db.rows(
        "SELECT status::text, claims, attempts, locked_by, waiting_for, result"
        " FROM asyncq_jobs WHERE id = %s",
        job_id,
    )[0]
    keys = ("status", "claims", "attempts", "locked_by", "waiting_for", "result")
    return dict(zip(keys, row, strict=True))


def count(ledger: Ledger, event: str, job_id: int) -> int:
    return len(ledger.events(event, job_id))


# -- a worker's sessions ------------------------------------------------------------------

MINE = "(application_name = 'asyncq:' || %s OR application_name LIKE 'asyncq:' || %s || ':%%')"


def sessions(db: Db, pid: int) -> list[tuple[Any, ...]]:
    """(application name, state, wait event type, query) of each server session of the
    worker process ``pid``."""
    return db.rows(
        "SELECT application_name, state, wait_event_type, query FROM pg_stat_activity"
        f" WHERE {MINE} AND backend_type = 'client backend'",
        str(pid),
        str(pid),
    )


def waiting_for_a_lock(db: Db, pid: int, statement: str) -> bool:
    """A session of worker ``pid`` runs ``statement`` (a part of its text) and waits
    for a lock."""
    return any(
        wait == "Lock" and statement in (query or "") for _, _, wait, query in sessions(db, pid)
    )


@contextmanager
def rows_locked(dsn: str, ids: Sequence[int]) -> Iterator[None]:
    """Hold ``FOR UPDATE`` on these jobs' rows: every fenced write of theirs, and every
    wake-up of theirs, waits until the block ends."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "SELECT id FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (list(ids),)
        )
        yield
        conn.rollback()
