"""The backend's configuration: OPTIONS, system checks, the DSN built from DATABASES,
migrations and the management commands."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.django.conftest import ROOT


def backend(options: dict[str, Any], **params: Any) -> Any:
    from asyncq.contrib.django import AsyncqBackend

    return AsyncqBackend("test", {"OPTIONS": options, **params})


def test_bad_options_are_refused_when_the_backend_is_made(django_dsn: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    for options, message in [
        ({"database": "default", "queues": {}}, r"unknown keys 'queues'.*queue_map"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"queue_map": {"a": 1}}, "queue_map"),
        ({"schema": "Bad-Name"}, "schema must be"),
        ({"app_options": {"pool_size": 3}}, "pool_size"),
        ({"dsn": ""}, "dsn"),
    ]:
        with pytest.raises(ImproperlyConfigured, match=message):
            backend(options)


def test_the_queues_a_worker_serves(django_dsn: str) -> None:
    made = backend({"queue_map": {"emails": "shop-emails"}}, QUEUES=["emails", "default"])
    assert made.worker_queues() == ["default", "shop-emails"]
    assert backend({}, QUEUES=[]).worker_queues() is None  # any queue name is allowed


def test_the_system_checks(django_dsn: str) -> None:
    from django.test import override_settings

    assert backend({}).check() == []
    [error] = backend({"database": "sqlite"}).check()
    assert error.id == "asyncq.E001" and "asyncq needs PostgreSQL" in error.msg
    [error] = backend({"database": "missing"}).check()
    assert error.id == "asyncq.E001" and "no database 'missing'" in error.msg
    with override_settings(INSTALLED_APPS=["tests.django.project.shop"]):
        [warning] = backend({}).check()
    assert warning.id == "asyncq.W001"


def test_the_workers_dsn_is_built_from_databases(django_dsn: str) -> None:
    from django.db import connections
    from psycopg.conninfo import conninfo_to_dict

    from asyncq.contrib.django.db import database_dsn

    built = conninfo_to_dict(database_dsn("default"))
    expected = conninfo_to_dict(django_dsn)
    assert built["dbname"] == expected["dbname"] and built.get("host") == expected.get("host")
    assert "cursor_factory" not in built and "context" not in built

    settings = connections["default"].settings_dict
    saved = dict(settings["OPTIONS"])
    settings["OPTIONS"].update({"sslmode": "disable", "application_name": "shop"})
    try:
        built = conninfo_to_dict(database_dsn("default"))
    finally:
        settings["OPTIONS"].clear()
        settings["OPTIONS"].update(saved)
    assert (built["sslmode"], built["application_name"]) == ("disable", "shop")
    assert backend({"dsn": "dbname=elsewhere"}).make_app().dsn_argument == "dbname=elsewhere"


def test_migrate_made_asyncqs_tables(django_dsn: str, django_db: Any) -> None:
    from django.core.management import call_command

    from asyncq.migrate import migrations

    versions = [v for (v,) in django_db.execute("SELECT version FROM asyncq_migrations")]
    assert versions == [m.version for m in migrations()]
    # The command says so, and does nothing more.
    from io import StringIO

    out = StringIO()
    call_command("asyncq_migrate", stdout=out)
    assert out.getvalue().strip() == "asyncq's tables are up to date"


def test_the_commands_refuse_a_backend_that_is_not_asyncqs(django_dsn: str) -> None:
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    with pytest.raises(CommandError, match="TASKS has no backend 'nope'"):
        call_command("asyncq_worker", backend="nope")
    immediate = {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}
    with (
        override_settings(TASKS={"default": immediate}),
        pytest.raises(CommandError, match=r"not asyncq\.contrib\.django\.AsyncqBackend"),
    ):
        call_command("asyncq_migrate")
    with pytest.raises(CommandError, match="--concurrency"):
        call_command("asyncq_worker", concurrency=0)


def test_the_app_needs_djangos_settings() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-m", "asyncq", "worker", "asyncq.contrib.django:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "asyncq: error: asyncq.contrib.django:app needs Django's settings:"
        " set DJANGO_SETTINGS_MODULE"
    )


def test_djangos_test_runner_gets_asyncqs_tables_in_its_test_database(django_dsn: str) -> None:
    """``manage.py test`` migrates a test database of its own: asyncq's migration makes
    the tables there (not in the database it was configured with)."""
    from tests.django.conftest import run_worker

    done = run_worker("django", "test", "tests.django.project.shop", "-v", "2", "--noinput")
    assert "Applying asyncq.0001_asyncq_tables... OK" in done.stdout
    assert "Ran 2 tests" in done.stderr and "OK" in done.stderr
