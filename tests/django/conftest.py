"""A real Django project (tests/django/project) whose tasks go through asyncq's
``django.tasks`` backend, on a database of its own made for this test run.

Django 6 needs Python 3.12+: where it is not installed (the default 3.11 virtualenv),
nothing here is collected. ``.ci/run`` runs these tests in a 3.12 virtualenv with the
``django`` extra.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _django_6() -> bool:
    if importlib.util.find_spec("django") is None:
        return False
    import django

    return django.VERSION >= (6, 0)


if not _django_6():
    collect_ignore_glob = ["*"]

ROOT = Path(__file__).resolve().parents[2]
DATABASE = f"asyncq_django_{os.getpid()}"
SETTINGS = "tests.django.project.settings"


@pytest.fixture(scope="session")
def django_dsn(server_dsn: str) -> Iterator[str]:
    """Django set up on a fresh database, migrated by ``manage.py migrate`` (which makes
    asyncq's tables too, through the migration of ``asyncq.contrib.django``)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DATABASE}"')
    dsn = make_conninfo(**{**conninfo_to_dict(server_dsn), "dbname": DATABASE})
    os.environ["ASYNCQ_DJANGO_DSN"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    yield dsn

    from django.db import connections

    connections.close_all()
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


@pytest.fixture
def django_db(django_dsn: str) -> Iterator[Any]:
    """An autocommit connection to the project's database, for assertions; every test
    starts without jobs or orders."""
    import psycopg

    with psycopg.connect(django_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE asyncq_jobs, shop_order RESTART IDENTITY")
        yield conn


def run_worker(*command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A worker in a process of its own, with the project's settings, until it exits:
    ``python -m django asyncq_worker ...`` or ``python -m asyncq worker ...``."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done
