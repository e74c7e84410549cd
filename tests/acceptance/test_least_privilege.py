"""docs/least-privilege.md, run as written: an owner that migrates, a producer that can only
insert, and a real worker process under a role with row access only."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from opentelemetry import trace
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import asyncq
from tests.harness.app import APP, GUARDED
from tests.harness.app import app as harness_app
from tests.harness.ledger import Ledger
from tests.harness.processes import REPO, Workers
from tests.harness.tracing import memory_exporter

DOC = REPO / "docs" / "least-privilege.md"
SCHEMA = "asyncq"
SECRET = "producer-cannot-read-this-2c9d"


def doc_sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


@dataclass
class Cluster:
    """A throwaway database and three roles with names unique to this run."""

    admin: str
    owner: str
    worker: str
    producer: str
    suffix: str
    dbname: str

    def localise(self, text: str) -> str:
        """The doc's SQL with this run's role and database names."""
        text = re.sub(
            r"\basyncq_(owner|worker|producer|dashboard)\b", rf"asyncq_\1_{self.suffix}", text
        )
        return re.sub(r"\bshop\b", self.dbname, text)

    def run_as(self, dsn: str, statements: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(self.localise(statements))


def as_role(server_dsn: str, dbname: str, user: str) -> str:
    params = conninfo_to_dict(server_dsn)
    params.pop("password", None)
    return make_conninfo(**{**params, "dbname": dbname, "user": user})


@pytest.fixture
def cluster(server_dsn: str) -> Iterator[Cluster]:
    suffix = secrets.token_hex(4)
    dbname = f"asyncq_privilege_{suffix}"
    kinds = ("owner", "worker", "producer", "dashboard")
    roles = [f"asyncq_{kind}_{suffix}" for kind in kinds]
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield Cluster(
            admin=as_role(server_dsn, dbname, str(conninfo_to_dict(server_dsn).get("user", ""))),
            owner=as_role(server_dsn, dbname, roles[0]),
            worker=as_role(server_dsn, dbname, roles[1]),
            producer=as_role(server_dsn, dbname, roles[2]),
            suffix=suffix,
            dbname=dbname,
        )
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            for role in roles:
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def denied(dsn: str, statement: str, params: Any = None) -> bool:
    """Whether ``statement`` fails with permission denied for this role."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(statement, params)
        except errors.InsufficientPrivilege:
            return True
    return False


def producer_app(
    dsn: str, *, tracing: bool = False
) -> tuple[asyncq.App, dict[str, asyncq.Task[Any, Any]]]:
    """The guarded app's tasks on an App with the producer's DSN (which never runs them)."""
    app = asyncq.App(dsn, schema=SCHEMA, tracing=tracing)
    tasks = {
        name.removeprefix("guarded."): app.task(
            name=name, queue=task.queue, max_attempts=task.max_attempts
        )(task.fn)
        for name, task in harness_app.tasks.items()
        if name in GUARDED
    }
    return app, tasks


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncq", *args],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_documented_roles_do_their_jobs_and_nothing_more(
    cluster: Cluster, workers: Workers, ledger: Ledger, tmp_path: Path
) -> None:
    roles_sql, grants_sql, worker_defers_sql = doc_sql_blocks()

    # 1. Roles and schema, as the admin.
    cluster.run_as(cluster.admin, roles_sql)

    # 2. The owner migrates: it owns the schema but has no CREATE on the database.
    owner_env = workers.env(ASYNCQ_DSN=cluster.owner, HARNESS_SCHEMA=SCHEMA)
    migrated = cli("migrate", APP, env=owner_env)
    assert migrated.returncode == 0, migrated.stderr
    assert "schema migrated to version" in migrated.stderr
    assert denied(cluster.owner, f'CREATE SCHEMA "other_{cluster.suffix}"')

    # 3. The grants, as the owner.
    cluster.run_as(cluster.owner, grants_sql)

    # The producer defers, in every way asyncq offers ...
    async def produce() -> dict[str, list[int]]:
        app, tasks = producer_app(cluster.producer)
        async with app:
            first = await tasks["ok"].options(unique_key="nightly").defer(token=SECRET)
            again = await tasks["ok"].options(unique_key="nightly").defer(token=SECRET)
            assert again == first
            many = await tasks["ok"].defer_many([{"token": SECRET}, {"token": SECRET}])
            async with await psycopg.AsyncConnection.connect(cluster.producer) as conn:
                async with conn.transaction():
                    in_tx = await tasks["ok"].options(conn=conn).defer(token=SECRET)
                cur = await conn.execute(
                    "INSERT INTO asyncq.asyncq_jobs (task_name, args) VALUES ('guarded.ok', '{}')"
                )
                assert cur.rowcount == 1
                await conn.commit()
            return {
                "ok": [first, *many, in_tx],
                "flaky": [await tasks["flaky"].defer(token=SECRET)],
                "doomed": [await tasks["doomed"].defer(token=SECRET)],
                "slow": [await tasks["slow"].defer(token=SECRET, seconds=1.6)],
                "until_fixed": [await tasks["until_fixed"].defer(token=SECRET)],
            }

    ids = anyio.run(produce)

    async def produce_one() -> list[int]:
        app, tasks = producer_app(cluster.producer)
        async with app:
            return [await tasks["ok"].defer(token=SECRET)]

    # ... and can do nothing else.
    producer, jobs = cluster.producer, "asyncq.asyncq_jobs"
    assert denied(producer, f"SELECT args FROM {jobs}")
    assert denied(producer, f"SELECT * FROM {jobs}")
    assert denied(producer, f"UPDATE {jobs} SET status = 'done'")
    assert denied(producer, f"UPDATE {jobs} SET run_at = now()")
    assert denied(producer, f"DELETE FROM {jobs}")
    assert denied(
        producer, f"INSERT INTO {jobs} (task_name, status) VALUES ('guarded.ok', 'running')"
    )
    assert denied(producer, f"INSERT INTO {jobs} (task_name, attempts) VALUES ('guarded.ok', 9)")
    assert denied(producer, f"CREATE TABLE {SCHEMA}.mine (x int)")
    with psycopg.connect(producer) as conn:  # what it may read
        assert conn.execute(f"SELECT count(id) FROM {jobs} WHERE status = 'queued'").fetchone()

    # Each of the producer's three readable columns is needed: every defer returns the id,
    # and a defer with a unique key also reads unique_key and status (ON CONFLICT and the
    # live job's id). Take one away, and those defers fail.
    for column in ("id", "unique_key", "status"):
        revoke = f"REVOKE SELECT ({column}) ON {jobs} FROM asyncq_producer"
        cluster.run_as(cluster.owner, revoke)

        async def defer_without(column: str = column) -> None:
            app, tasks = producer_app(producer)
            async with app:
                with pytest.raises(errors.InsufficientPrivilege):
                    await tasks["ok"].options(unique_key=f"needs-{column}").defer()
                if column == "id":
                    with pytest.raises(errors.InsufficientPrivilege):
                        await tasks["ok"].defer()
                else:
                    assert await tasks["ok"].defer() > 0

        try:
            anyio.run(defer_without)
        finally:
            cluster.run_as(cluster.owner, revoke.replace("REVOKE", "GRANT").replace("FROM", "TO"))

    # A producer of an App with tracing on also writes trace_context: refused until it
    # has the documented grant.
    memory_exporter()  # a tracer provider, so that the defer's span has a context to write

    async def traced_defer() -> int:
        app, tasks = producer_app(producer, tracing=True)
        async with app:
            with trace.get_tracer("tests").start_as_current_span("request"):
                return await tasks["ok"].defer(token=SECRET)

    with pytest.raises(errors.InsufficientPrivilege):
        anyio.run(traced_defer)
    grant = re.search(r"^GRANT INSERT \(trace_context\) .*;$", DOC.read_text(), flags=re.M)
    assert grant, "docs/least-privilege.md lost the grant of trace_context"
    cluster.run_as(cluster.owner, grant[0])
    ids["ok"].append(anyio.run(traced_defer))
    with psycopg.connect(cluster.owner) as owner:
        traced_row = owner.execute(
            f"SELECT trace_context ? 'traceparent' FROM {jobs} WHERE id = %s", (ids["ok"][-1],)
        ).fetchone()
    assert traced_row == (True,)

    # A job whose worker vanished (for the reaper) and an old done row (for pruning).
    with psycopg.connect(cluster.owner, autocommit=True) as owner:
        [(orphan,)] = owner.execute(
            f"INSERT INTO {jobs} (task_name, args, status, attempts, locked_by, locked_at,"
            "                     lease, expires_at)"
            " VALUES ('guarded.ok', '{}', 'running', 1, 'vanished', now() - interval '1 min',"
            "         interval '30 s', now() - interval '30 s') RETURNING id"
        ).fetchall()
        [(old,)] = owner.execute(
            f"INSERT INTO {jobs} (task_name, status, finished_at)"
            " VALUES ('guarded.ok', 'done', now() - interval '8 days') RETURNING id"
        ).fetchall()

    # 4. A real worker process under the worker role: runs, retries, fails, heartbeats
    # (the slow job outlives its 1 s lease), reaps and prunes.
    worker_env = workers.env(ASYNCQ_DSN=cluster.worker, HARNESS_SCHEMA=SCHEMA)
    status = f"SELECT id, status::text, attempts FROM {jobs} ORDER BY id"

    def drain(env: dict[str, str]) -> str:
        logs = ""
        with psycopg.connect(cluster.owner, autocommit=True) as owner:
            for _ in range(5):
                run = cli("worker", APP, "--drain", "--lease", "1", env=env)
                assert run.returncode == 0, run.stderr
                logs += run.stderr
                rows = owner.execute(status).fetchall()
                if all(s in ("done", "failed") for _, s, _ in rows):
                    return logs
        raise AssertionError(f"jobs left unfinished: {rows}\n{logs}")

    logs = drain(worker_env)
    with psycopg.connect(cluster.owner, autocommit=True) as owner:
        outcome = {i: (s, a) for i, s, a in owner.execute(status).fetchall()}
        errors_of = dict(owner.execute(f"SELECT id, last_error FROM {jobs}").fetchall())
    for job_id in ids["ok"]:
        assert outcome[job_id] == ("done", 1)
    assert outcome[ids["flaky"][0]] == ("done", 2)  # retried, then done
    assert outcome[ids["doomed"][0]] == ("failed", 2)  # retried, then failed
    assert outcome[ids["until_fixed"][0]] == ("failed", 1)
    assert outcome[ids["slow"][0]] == ("done", 1)  # the heartbeat kept its lease
    assert outcome[orphan] == ("done", 2)  # reaped, then run
    assert "LeaseExpired" in errors_of[orphan]
    assert old not in outcome  # pruned
    with psycopg.connect(cluster.owner) as owner:
        sampled = owner.execute(
            f"SELECT count(*) FROM {SCHEMA}.asyncq_queue_samples WHERE queue = 'default'"
        ).fetchone()
    assert sampled is not None and sampled[0] >= 1  # the queue trends, written by the worker
    for problem in ("permission denied", "InsufficientPrivilege", "failed (", "Traceback"):
        assert problem not in logs, logs
    assert len(ledger.events("end", ids["slow"][0])) == 1

    # The worker role also runs `asyncq requeue`; after the fix the job runs to done.
    [fixed] = ids["until_fixed"]
    requeued = cli("requeue", APP, str(fixed), env=worker_env)
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout.strip() == f"requeued 1 jobs: {fixed}"
    drain(workers.env(ASYNCQ_DSN=cluster.worker, HARNESS_SCHEMA=SCHEMA, HARNESS_FIXED="1"))
    assert outcome_of(cluster.owner, fixed) == ("done", 1)

    # Without its rights on asyncq_workers a worker still runs its jobs, unlisted.
    cluster.run_as(cluster.owner, "REVOKE ALL ON asyncq.asyncq_workers FROM asyncq_worker")
    [unlisted_job] = anyio.run(produce_one)
    unlisted = drain(worker_env)
    assert outcome_of(cluster.owner, unlisted_job) == ("done", 1)
    assert "is not listed by `asyncq workers`" in unlisted, unlisted
    assert "Traceback" not in unlisted

    # What the worker cannot do.
    worker = cluster.worker
    assert denied(worker, f"INSERT INTO {jobs} (task_name) VALUES ('guarded.ok')")
    assert denied(worker, f"UPDATE {jobs} SET args = '{{}}'")
    assert denied(worker, f"UPDATE {jobs} SET task_name = 'guarded.ok'")
    assert denied(worker, f"UPDATE {jobs} SET queue = 'elsewhere'")
    assert denied(worker, f"CREATE TABLE {SCHEMA}.mine (x int)")
    refused = cli("migrate", APP, env=worker_env)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[-1] == "asyncq: error: permission denied for schema asyncq"
    assert "Traceback" not in refused.stderr

    # A role without the worker's grants is told so at start, and the worker exits.
    producer_env = workers.env(ASYNCQ_DSN=cluster.producer, HARNESS_SCHEMA=SCHEMA)
    wrong_role = cli("worker", APP, "--drain", env=producer_env)
    assert wrong_role.returncode == 1, wrong_role.stderr
    last = wrong_role.stderr.splitlines()[-1]
    assert last.startswith("asyncq: error: role ") and "cannot run a worker" in last, last
    assert "UPDATE (status)" in last and "DELETE" in last and "SELECT (args)" in last, last
    assert "Traceback" not in wrong_role.stderr

    # A worker whose tasks defer jobs gets the producer's privileges.
    cluster.run_as(cluster.admin, worker_defers_sql)
    assert not denied(worker, f"INSERT INTO {jobs} (task_name) VALUES ('guarded.ok')")


def outcome_of(dsn: str, job_id: int) -> tuple[str, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT status::text, attempts FROM asyncq.asyncq_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return (row[0], row[1])


def doc_block_with(text: str) -> str:
    """The fenced block of the page that holds ``text``."""
    fenced = re.findall(r"^```\w*\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)
    [block] = [b for b in fenced if text in b]
    return block


def test_the_documented_dashboard_role_runs_bulk_actions_and_only_adds_audit_records(
    cluster: Cluster, workers: Workers
) -> None:
    roles_sql, grants_sql, _ = doc_sql_blocks()
    cluster.run_as(cluster.admin, roles_sql)
    owner_env = workers.env(ASYNCQ_DSN=cluster.owner, HARNESS_SCHEMA=SCHEMA)
    migrated = cli("migrate", APP, env=owner_env)
    assert migrated.returncode == 0, migrated.stderr
    cluster.run_as(cluster.owner, grants_sql)
    cluster.run_as(cluster.admin, doc_block_with("CREATE ROLE asyncq_dashboard"))
    cluster.run_as(cluster.owner, doc_block_with("TO asyncq_dashboard;\nGRANT SELECT, INSERT"))
    dashboard = as_role(cluster.admin, cluster.dbname, f"asyncq_dashboard_{cluster.suffix}")
    jobs, audit = f"{SCHEMA}.asyncq_jobs", f"{SCHEMA}.asyncq_audit"
    with psycopg.connect(cluster.owner, autocommit=True) as owner:
        owner.execute(
            f"INSERT INTO {jobs} (task_name, args, status, finished_at)"
            " SELECT 'guarded.ok', '{}', 'failed', now() FROM generate_series(1, 3)"
        )
    env = workers.env(ASYNCQ_DSN=dashboard, HARNESS_SCHEMA=SCHEMA)
    for action in (["requeue"], ["priority", "7"], ["move", "elsewhere"], ["cancel"], ["delete"]):
        done = cli("bulk", APP, *action, "--yes", env=env)
        assert done.returncode == 0, (action, done.stderr)
        assert "3 of 3 matching jobs changed" in done.stdout, (action, done.stdout)
    listed = cli("audit", APP, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["action"] for r in records] == ["delete", "cancel", "move", "priority", "requeue"]
    assert {(r["rows"], r["state"]) for r in records} == {(3, "done")}
    # The records are the dashboard's to add, not to rewrite or remove.
    assert denied(dashboard, f"DELETE FROM {audit}")
    assert denied(dashboard, f"UPDATE {audit} SET actor = 'someone else'")
    assert denied(dashboard, f"UPDATE {audit} SET filter = '{{}}'")
    assert denied(dashboard, f"UPDATE {jobs} SET task_name = 'other'")
    # The queue trends, read through its worker role.
    assert not denied(dashboard, f"SELECT * FROM {SCHEMA}.asyncq_queue_samples")
