"""The ``asyncq`` command: version, help, and one-line errors instead of tracebacks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import asyncq
from tests.harness.app import APP, NOOP
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers

WORKER_OPTIONS = [
    "--queue",
    "--concurrency",
    "--batch-size",
    "--lease",
    "--grace",
    "--poll-interval",
    "--drain",
]


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one ``asyncq: error:`` line and no traceback."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("asyncq: error:")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().endswith(errors[0]), result.stderr
    return errors[0]


def test_version(workers: Workers) -> None:
    result = workers.cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"asyncq {asyncq.__version__}"

    script = Path(sys.executable).with_name("asyncq")
    if script.exists():  # the console script says the same as `python -m asyncq`
        installed = subprocess.run(
            [script, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        assert (installed.returncode, installed.stdout) == (0, result.stdout)


def test_worker_help_lists_every_option(workers: Workers) -> None:
    result = workers.cli("worker", "--help")
    assert result.returncode == 0, result.stderr
    for option in WORKER_OPTIONS:
        assert option in result.stdout, option


@pytest.mark.parametrize(
    ("target", "mentions"),
    [
        ("nosuchmodule:app", "nosuchmodule"),
        ("tests.harness.app:nope", "nope"),
        ("tests.harness.app:noop", "not an asyncq.App"),
        ("tests.harness.app", "MODULE:APP"),
    ],
)
def test_a_bad_app_path_is_a_one_line_error(workers: Workers, target: str, mentions: str) -> None:
    error = one_line_error(workers.cli("worker", target))
    assert mentions in error


def test_an_unreachable_database_is_a_one_line_error(workers: Workers) -> None:
    env = workers.env(ASYNCQ_DSN="postgresql://postgres@127.0.0.1:1/x", HARNESS_CONNECT_TIMEOUT="1")
    error = one_line_error(workers.cli("worker", APP, env=env))
    assert "127.0.0.1:1" in error


@pytest.mark.parametrize(
    "args",
    [("--queue", "q", "5"), ("5", "--queue", "q"), ("--all-failed", "7", "8")],
    ids=" ".join,
)
def test_requeue_with_ids_and_a_filter_says_which_to_give(
    workers: Workers, args: tuple[str, ...]
) -> None:
    error = one_line_error(workers.cli("requeue", APP, *args))
    assert "not both" in error


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--lease", "inf"),
        ("--lease", "nan"),
        ("--lease", "0"),
        ("--lease", "soon"),
        ("--poll-interval", "0"),
        ("--grace", "-1"),
        ("--concurrency", "0"),
        ("--batch-size", "-3"),
    ],
    ids=lambda value: str(value),
)
def test_a_bad_worker_option_is_a_one_line_error(workers: Workers, option: str, value: str) -> None:
    error = one_line_error(workers.cli("worker", APP, option, value, timeout=15))
    assert option in error and value in error


def test_unknown_options_are_still_refused(workers: Workers) -> None:
    result = workers.cli("requeue", APP, "--queue", "q", "--bogus")
    assert result.returncode == 2
    assert "unrecognized arguments: --bogus" in result.stderr


@pytest.fixture
def empty_database(server_dsn: str) -> Iterator[str]:
    """A database on the test server on which asyncq was never migrated."""
    name = f"asyncq_test_{os.getpid()}_empty"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(**{**conninfo_to_dict(server_dsn), "dbname": name})
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize(
    "command",
    [
        ["worker"],
        ["jobs"],
        ["job", "1"],
        ["queues"],
        ["stats"],
        ["schedules"],
        ["cancel", "1"],
        ["pause", "q"],
        ["resume", "q"],
        ["requeue", "1"],
        ["requeue", "--all-failed"],
        ["prune"],
    ],
    ids=" ".join,
)
def test_every_command_on_a_never_migrated_database_names_the_migrate_command(
    workers: Workers, empty_database: str, command: list[str]
) -> None:
    env = workers.env(ASYNCQ_DSN=empty_database)
    error = one_line_error(workers.cli(command[0], APP, *command[1:], env=env))
    assert f"run `asyncq migrate {APP}` (or `await app.migrate()`)" in error, error
    database = conninfo_to_dict(empty_database)["dbname"]
    assert re.search(
        rf"there is no asyncq_[a-z_]+ (table|function) in database '{database}'", error
    ), error


def test_a_never_migrated_database_says_to_migrate_then_works(
    workers: Workers, ledger: Ledger, empty_database: str
) -> None:
    env = workers.env(ASYNCQ_DSN=empty_database)
    error = one_line_error(workers.cli("worker", APP, env=env))
    assert "asyncq migrate" in error

    migrated = workers.cli("migrate", APP, env=env)
    assert migrated.returncode == 0, migrated.stderr
    again = workers.cli("migrate", APP, env=env)
    assert again.returncode == 0, again.stderr

    with psycopg.connect(empty_database, autocommit=True) as conn:
        ids = insert_jobs(conn, NOOP, [{"n": 1}, {"n": 2}])
        drained = workers.cli("worker", APP, "--drain", env=env)
        assert drained.returncode == 0, drained.stderr
        statuses = conn.execute("SELECT status::text FROM asyncq_jobs ORDER BY id").fetchall()
    assert statuses == [("done",), ("done",)]
    assert sorted(e.job_id for e in ledger.events("end")) == ids
