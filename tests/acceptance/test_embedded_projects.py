"""Each project its own database on the embedded server: two projects of one user share
neither tables nor jobs; a script of a project and ``asyncq`` commands on its module
find the same one; an explicit choice and a DSN win. Real processes, started in each
project's directory with no DSN in their environment, on the embedded PostgreSQL (the
one the tests use when ``$ASYNCQ_TEST_DSN`` is not set)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import asyncq
from asyncq import embedded
from asyncq.store import create_database_sync

REPO = Path(__file__).resolve().parents[2]

JOBS = """
import asyncio

import asyncq

app = asyncq.App({options})


@app.task(name="jobs.work")
async def work(n: int) -> None:
    pass


async def defer_one() -> None:
    async with app:
        await app.migrate()
        print(await work.defer(1))


if __name__ == "__main__":
    asyncio.run(defer_one())
"""


class Projects:
    """Project directories under the test's temporary directory, each named with a
    token of its own; the databases they make are dropped at the end."""

    def __init__(self, root: Path, server_dsn: str) -> None:
        self.root = root
        self.server_dsn = server_dsn
        self.token = secrets.token_hex(3)

    def make(self, name: str, *, options: str = "") -> Path:
        project = self.root / f"{name}_{self.token}"
        project.mkdir()
        (project / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
        (project / "jobs.py").write_text(JOBS.format(options=options))
        return project

    def database(self, name: str) -> str:
        return f"asyncq_{name}_{self.token}"

    def drop(self) -> None:
        with psycopg.connect(self.server_dsn, autocommit=True) as admin:
            names = admin.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                (f"%{self.token}",),
            ).fetchall()
            for (name,) in names:
                admin.execute(
                    psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        psycopg.sql.Identifier(name)
                    )
                )


@pytest.fixture
def projects(tmp_path: Path) -> Iterator[Projects]:
    try:
        server_dsn = embedded.start()
    except asyncq.AsyncqError as exc:
        pytest.skip(f"the embedded PostgreSQL is not installed: {exc}")
    made = Projects(tmp_path, server_dsn)
    try:
        yield made
    finally:
        made.drop()


def env(**extra: str) -> dict[str, str]:
    found = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ASYNCQ_DSN", "ASYNCQ_TEST_DSN", embedded.DATABASE_ENV)
    }
    found["PYTHONUNBUFFERED"] = "1"
    return {**found, **extra}


def run(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env(**extra),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def asyncq_command(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    result = run(cwd, "-m", "asyncq", *args, **extra)
    assert result.returncode == 0, result.stderr
    return result


def first_line(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stderr or result.stdout).splitlines()[0]


def test_two_projects_have_a_database_each(projects: Projects) -> None:
    shop, blog = projects.make("shop"), projects.make("blog")
    for project, name in ((shop, "shop"), (blog, "blog")):
        migrated = asyncq_command(project, "migrate", "jobs:app")
        line = first_line(migrated)
        assert "asyncq.embedded: using the embedded PostgreSQL in" in line, line
        assert f"database {projects.database(name)} (the project in {project}" in line, line
        assert "created now" in line
    deferred = run(shop, "jobs.py")  # a script of the project: the same database
    assert deferred.returncode == 0, deferred.stderr
    [job_id] = [int(line) for line in deferred.stdout.split()]

    # The same task name in both: a worker of the blog never sees the shop's job.
    drained = asyncq_command(blog, "worker", "jobs:app", "--drain")
    assert "job " not in drained.stderr, drained.stderr
    listed = asyncq_command(shop, "jobs", "jobs:app", "--json").stdout.splitlines()
    assert [(j["id"], j["status"]) for j in map(json.loads, listed)] == [(job_id, "queued")]
    assert asyncq_command(blog, "jobs", "jobs:app").stdout.strip() == "no jobs"


def test_the_quickstart_and_the_worker_command_find_the_same_database(
    projects: Projects,
) -> None:
    """The README's `python examples/quickstart.py`, then `asyncq worker` and `asyncq
    jobs` on `examples.quickstart:app`, from the root of a copy of the repository."""
    root = projects.root / f"repo_{projects.token}"
    (root / "examples").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root)
    for name in ("__init__.py", "quickstart.py"):
        shutil.copy(REPO / "examples" / name, root / "examples")
    database = projects.database("repo")
    quickstart = run(root, "examples/quickstart.py")
    assert quickstart.returncode == 0, quickstart.stdout + quickstart.stderr
    assert "all 203 jobs done" in quickstart.stdout
    assert f"database {database} (the project in {root}; created now)" in quickstart.stdout
    assert f"database:     {database} on the embedded PostgreSQL in" in quickstart.stdout

    worker = asyncq_command(root, "worker", "examples.quickstart:app", "--drain")
    assert f"database {database} (the project in {root})" in first_line(worker)
    listed = asyncq_command(root, "jobs", "examples.quickstart:app", "-n", "1000", "--json")
    assert len(listed.stdout.splitlines()) == 203


def test_an_explicit_database_and_a_dsn_win(projects: Projects) -> None:
    chosen = f"asyncq_chosen_{projects.token}"
    shop = projects.make("shop")
    by_env = asyncq_command(shop, "migrate", "jobs:app", ASYNCQ_EMBEDDED_DATABASE=chosen)
    assert f"database {chosen} (from ASYNCQ_EMBEDDED_DATABASE; created now)" in first_line(by_env)

    named = f"asyncq_named_{projects.token}"
    blog = projects.make("blog", options=f"embedded_database={named!r}")
    by_app = asyncq_command(blog, "migrate", "jobs:app", ASYNCQ_EMBEDDED_DATABASE=chosen)
    assert f"database {named} (App(embedded_database=...); created now)" in first_line(by_app)

    dsn = psycopg.conninfo.make_conninfo(projects.server_dsn, dbname=chosen)
    by_dsn = asyncq_command(blog, "migrate", "jobs:app", ASYNCQ_DSN=dsn)
    assert "(from ASYNCQ_DSN)" in first_line(by_dsn) and "embedded" not in by_dsn.stderr


def test_processes_racing_to_make_the_database_all_use_it(projects: Projects) -> None:
    shop = projects.make("shop")
    starts = [
        subprocess.Popen(
            [sys.executable, "-m", "asyncq", "migrate", "jobs:app"],
            cwd=shop,
            env=env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    ended = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in starts]
    for p in starts:
        for stream in (p.stdout, p.stderr):
            if stream:
                stream.close()
    assert [code for code, _ in ended] == [0] * 4, ended
    made = [err for _, err in ended if "created now" in err.splitlines()[0]]
    assert len(made) == 1, ended


def test_the_database_is_made_once_however_many_ask_at_once(server_dsn: str) -> None:
    name = f"asyncq_race_{secrets.token_hex(3)}"
    barrier = threading.Barrier(6)
    made: list[bool] = []

    def make() -> None:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            barrier.wait()
            made.append(create_database_sync(conn, name))

    threads = [threading.Thread(target=make) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(made) == [False] * 5 + [True]
        database = conninfo_to_dict(server_dsn) | {"dbname": name}
        with psycopg.connect(**database) as conn:  # type: ignore[arg-type]
            assert conn.execute("SELECT current_database()").fetchone() == (name,)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
