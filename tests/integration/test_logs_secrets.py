"""Logs never carry job arguments or a DSN password."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import asyncq

pytestmark = pytest.mark.anyio

ARG_SECRET = "arg-secret-4f1c9e"
PASSWORD = "dsn-password-7b2d0a"


def with_password(dsn: str) -> str | None:
    """The DSN with a password added, if the server still accepts it (trust auth)."""
    params = conninfo_to_dict(dsn)
    if params.get("password"):
        return None
    params["password"] = PASSWORD
    candidate = make_conninfo(**params)
    try:
        with psycopg.connect(candidate, connect_timeout=5):
            return candidate
    except psycopg.OperationalError:
        return None


def everything_logged(records: list[logging.LogRecord]) -> str:
    parts = []
    for record in records:
        parts.append(record.getMessage())
        parts.extend(repr(v) for v in vars(record).values())
    return "\n".join(parts)


async def test_info_logs_hold_no_arguments_and_no_password(
    dsn: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    secret_dsn = with_password(dsn)
    caplog.set_level(logging.INFO)
    async with asyncq.App(secret_dsn or dsn) as app:
        assert secret_dsn is None or PASSWORD in app.dsn

        @app.task(retry=asyncq.Backoff(base=0.01, cap=0.02), max_attempts=2)
        async def login(user: str, token: str) -> None:
            if asyncq.current_job().attempt == 1:
                raise PermissionError("first attempt refused")

        @app.task(max_attempts=1, name="strict")
        async def strict(user: str) -> None:
            pass

        ok = await login.defer("ann", token=ARG_SECRET)
        many = await login.defer_many([{"user": "bob", "token": ARG_SECRET}])
        with pytest.raises(TypeError):
            await login.defer("ann", token=ARG_SECRET, extra=ARG_SECRET)  # type: ignore[call-arg]
        # A stored job whose arguments do not fit, with the secret in them.
        db.execute(
            "INSERT INTO asyncq_jobs (task_name, args, max_attempts) VALUES ('strict', %s, 1)",
            (f'{{"user": "{ARG_SECRET}", "token": "{ARG_SECRET}"}}',),
        )
        ids = [ok, *many]
        while db.execute(
            "SELECT count(*) FROM asyncq_jobs WHERE status NOT IN ('done', 'failed')"
        ).fetchone() != (0,):
            await app.run_worker(drain=True, handle_signals=False)
            db.execute("UPDATE asyncq_jobs SET run_at = now() WHERE status = 'queued'")

    statuses = db.execute(
        "SELECT status::text, attempts FROM asyncq_jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert statuses == [("done", 2), ("done", 2)]  # the jobs really ran, and failed once
    logged = everything_logged(caplog.records)
    assert caplog.records, "expected some INFO logs"
    assert "first attempt refused" in logged  # failures are logged ...
    assert ARG_SECRET not in logged  # ... but never the arguments
    assert PASSWORD not in logged
    assert ARG_SECRET not in caplog.text and PASSWORD not in caplog.text
