"""A rolling upgrade: workers of the previous schema version keep running while the new
migration is applied to their live table and workers of this version join them, then
the old ones stop. Jobs deferred all along run exactly once; nothing is lost.

The previous versions are this repository's own code from before a migration, taken
from git (the test skips where there is no git history): the last code at schema
version 2 (which these upgrades began from) and the last one at each later version."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from asyncq.migrate import LATEST_VERSION
from tests.harness.processes import REPO, WorkerProcess
from tests.harness.waiting import wait_until

APP_SOURCE = """
import os
import asyncq
import psycopg

app = asyncq.App(schema=os.environ["UPGRADE_SCHEMA"])

@app.task(max_attempts=5)
async def work(n: int) -> dict:
    job = asyncq.current_job()
    dsn = os.environ["ASYNCQ_DSN"]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute(
            "INSERT INTO upgrade_runs (job_id, attempt, version) VALUES (%s, %s, %s)",
            (job.id, job.attempt, os.environ["UPGRADE_VERSION"]),
        )
    return {"n": n}
"""


def previous_version(version: int, into: Path) -> Path:
    """The asyncq package as it was at schema ``version`` (just before the migration after
    it was added), under ``into``."""
    latest = sorted((REPO / "asyncq/sql/migrations").glob(f"{version + 1:04d}_*.sql"))[0]
    try:
        first = subprocess.run(
            ["git", "-C", str(REPO), "rev-list", "--reverse", "HEAD", "--", str(latest)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", f"{first}^", "asyncq"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError, IndexError) as exc:
        pytest.skip(f"no git history to take the previous version from: {exc}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    found = sorted((into / "asyncq/sql/migrations").glob("*.sql"))
    reached = int(found[-1].name[:4]) if found else 0
    if reached != version:
        # Migrations added in one commit: no code of this repository ever stopped at this
        # version, so none was deployed at it.
        pytest.skip(f"no commit stops at schema version {version} (the one before is at {reached})")
    return into


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    name = f"upgrade_{secrets.token_hex(3)}"
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        conn.execute("DROP TABLE IF EXISTS upgrade_runs")


@pytest.mark.parametrize("old_version", range(2, LATEST_VERSION))
def test_old_and_new_workers_share_the_table_through_the_migration(
    dsn: str, schema: str, tmp_path: Path, old_version: int
) -> None:
    old_code = previous_version(old_version, tmp_path / "old")
    (tmp_path / "upgrade_app.py").write_text(APP_SOURCE)
    started: list[WorkerProcess] = []

    def env(version: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("ASYNCQ_TEST_DSN", None)
        path = [str(tmp_path)] + ([str(old_code)] if version == "old" else [str(REPO)])
        env.update(
            ASYNCQ_DSN=dsn,
            UPGRADE_SCHEMA=schema,
            UPGRADE_VERSION=version,
            PYTHONPATH=os.pathsep.join(path),
            PYTHONUNBUFFERED="1",
        )
        return env

    def asyncq_cmd(version: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "asyncq", *args],
            env=env(version),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def start(version: str) -> WorkerProcess:
        worker = WorkerProcess(
            [
                sys.executable,
                "-P",  # the working directory (the repository) is not put first on the path
                "-m",
                "asyncq",
                "worker",
                "upgrade_app:app",
                "--lease",
                "3",
                "--concurrency",
                "8",
            ],
            env(version),
            tmp_path / f"worker-{version}-{len(started)}.log",
        )
        started.append(worker)
        return worker.wait_ready(30)

    db: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
    try:
        db.execute(
            "CREATE TABLE upgrade_runs (job_id bigint, attempt int, version text,"
            " at timestamptz DEFAULT clock_timestamp())"
        )
        migrated = asyncq_cmd("old", "migrate", "upgrade_app:app")
        assert migrated.returncode == 0, migrated.stderr
        version = db.execute(f'SELECT max(version) FROM "{schema}".asyncq_migrations').fetchone()
        assert version is not None and version[0] == old_version

        jobs = f'"{schema}".asyncq_jobs'
        deferred: list[int] = []

        def defer(count: int) -> None:
            rows = db.execute(
                f"INSERT INTO {jobs} (task_name, args)"
                " SELECT 'upgrade_app.work', jsonb_build_object('n', n)"
                " FROM generate_series(1, %s) AS n RETURNING id",
                (count,),
            ).fetchall()
            deferred.extend(r[0] for r in rows)

        old = [start("old"), start("old")]
        for _ in range(10):
            defer(20)
            time.sleep(0.05)

        # The migration lands on the live table while the old workers claim from it.
        migrated = asyncq_cmd("new", "migrate", "upgrade_app:app")
        assert migrated.returncode == 0, migrated.stderr
        for _ in range(10):
            defer(20)
            time.sleep(0.05)
        new = start("new")
        for _ in range(10):
            defer(20)
            time.sleep(0.05)

        def all_done() -> bool:
            row = db.execute(
                f"SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM {jobs}"
            ).fetchone()
            return row is not None and row[0] == row[1] == len(deferred)

        # The old workers stop with nothing left to write: the code before 172eee7 could
        # cut off an outcome write under way when it stopped, and the job ran again
        # after its lease (the current code's stop is tested in tests/acceptance).
        wait_until(all_done, 60, "the jobs so far to be done")
        for worker in old:
            worker.send(signal.SIGTERM)
            assert worker.popen.wait(30) == 0, worker.stderr()
        defer(50)
        wait_until(all_done, 60, "every job to be done")
        runs = db.execute(
            "SELECT job_id, count(*), array_agg(DISTINCT version) FROM upgrade_runs GROUP BY job_id"
        ).fetchall()
        assert {r[0] for r in runs} == set(deferred), "a job never ran"
        assert all(r[1] == 1 for r in runs), "a job ran twice"
        versions = {v for r in runs for v in r[2]}
        assert versions == {"old", "new"}, versions
        # The new workers store results; the old ones know nothing of the column.
        by_new = db.execute(
            f"SELECT count(*) FILTER (WHERE j.result IS NOT NULL), count(*) FROM {jobs} j"
            " JOIN upgrade_runs r ON r.job_id = j.id WHERE r.version = 'new'"
        ).fetchone()
        assert by_new is not None and by_new[1] > 0
        assert by_new[0] == by_new[1], "a job run by a new worker has no result"
        for worker in started:
            assert "Traceback" not in worker.stderr(), worker.stderr()
        new.send(signal.SIGTERM)
        assert new.popen.wait(30) == 0
    finally:
        for worker in started:
            worker.kill()
        db.close()
