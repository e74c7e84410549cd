"""Through PgBouncer in transaction mode without ``prepare_threshold=None``: the first
statement psycopg prepares meets a server connection that holds a statement of the same
name (or lacks its own), and asyncq says so in one line that names the cure, from the
worker command and from defers and admin calls alike. Migrations never prepare.

The PgBouncer here is made to fail at once: each of its server connections already
holds ``_pg3_0``, the name psycopg gives a connection's first prepared statement.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import asyncq
from tests.harness.app import APP, WORK
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.pgbouncer import PgBouncer
from tests.harness.processes import Workers
from tests.pgbouncer.conftest import start

pytestmark = pytest.mark.anyio

CURE = "give the App prepare_threshold=None (the PgBouncer guide, docs/how-to/pgbouncer.md)"


def take(bouncer: PgBouncer, dsn: str) -> None:
    """Prepare ``_pg3_0`` on each server connection of ``dsn``'s database."""
    # Each client holds its transaction, and so its own server connection, while it
    # prepares its first statement there.
    clients = [
        psycopg.connect(bouncer.through(dsn), prepare_threshold=0) for _ in range(bouncer.pool_size)
    ]
    pids = set()
    for conn in clients:
        row = conn.execute("SELECT pg_backend_pid()", prepare=True).fetchone()
        assert row is not None
        pids.add(row[0])
    for conn in clients:
        conn.commit()
        conn.close()
    assert len(pids) == bouncer.pool_size


@pytest.fixture
def fresh(pgbouncer_binary: str, server_dsn: str) -> Iterator[PgBouncer]:
    bouncer = start(pgbouncer_binary, server_dsn)
    yield bouncer
    bouncer.close()


@pytest.fixture
def taken(fresh: PgBouncer, dsn: str) -> PgBouncer:
    """A PgBouncer each of whose server connections to the test database holds a
    prepared ``_pg3_0``."""
    take(fresh, dsn)
    return fresh


def test_the_worker_command_stops_with_one_line(
    db: psycopg.Connection[tuple[object, ...]],
    dsn: str,
    taken: PgBouncer,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    workers = Workers(taken.through(dsn), ledger, tmp_path, HARNESS_LISTEN_DSN=dsn)
    insert_jobs(db, WORK, [{"tag": n} for n in range(20)])
    run = workers.cli("worker", APP, "--poll-interval", "0.05", timeout=60)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("asyncq: error:")]
    assert len(errors) == 1, run.stderr
    assert "refused a prepared statement" in errors[0] and CURE in errors[0]


async def test_defers_and_admin_calls_raise_one_clear_error(dsn: str, taken: PgBouncer) -> None:
    app = asyncq.App(taken.through(dsn), listen_dsn=dsn)

    @app.task(name="pgb.refused")
    async def work(n: int) -> None:
        pass

    async with app:
        with pytest.raises(asyncq.PreparedStatementsRefused, match="prepare_threshold=None") as e:
            for n in range(10):  # one after the other: all on the defers' one connection
                await work.defer(n)
        assert isinstance(e.value.__cause__, psycopg.errors.DuplicatePreparedStatement)
        assert CURE in str(e.value)
    # A connection names its next prepared statement anew: another App for the admin call.
    async with asyncq.App(taken.through(dsn), listen_dsn=dsn, pool_max_size=1) as admin:
        with pytest.raises(asyncq.PreparedStatementsRefused, match="prepare_threshold=None"):
            for _ in range(10):
                await admin.pause("pgb")


async def test_migrations_prepare_nothing(fresh: PgBouncer, throwaway_dsn: str) -> None:
    """Each statement of a migration runs once, but the record of each is one statement:
    the sixth migration's would be prepared. asyncq migrates without preparing."""
    take(fresh, throwaway_dsn)
    async with asyncq.App(fresh.through(throwaway_dsn), listen_dsn=throwaway_dsn) as app:
        assert await app.migrate()
        assert await app.migrate() == []
