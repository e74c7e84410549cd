"""The names of the contract's Part two (control of jobs), as written there: each exists,
takes the keywords the contract gives it, and refuses bad input at declaration."""

from __future__ import annotations

import inspect

import pytest

import asyncq


def keywords(fn: object) -> set[str]:
    return set(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_the_part_two_names_exist_with_their_keywords() -> None:
    for name in ("Retry", "Snooze", "Discard", "JobFailed", "JobCancelled", "JobNotFound"):
        assert name in asyncq.__all__, name
    assert issubclass(asyncq.JobNotFound, asyncq.AsyncqError)
    app = asyncq.App
    assert {"cron", "name", "queue", "kwargs", "tz"} <= keywords(app.periodic)
    assert {"task", "cron", "name", "kwargs", "tz"} <= keywords(app.schedule)
    assert {"job_id", "timeout"} <= keywords(app.result)
    assert {"job_ids"} <= keywords(app.cancel)
    assert {"queue"} <= keywords(app.pause) and {"queue"} <= keywords(app.resume)
    assert {
        "queue",
        "max_attempts",
        "name",
        "retry_on",
        "timeout",
        "concurrency",
        "rate_limit",
        "group_concurrency",
    } <= keywords(app.task)
    assert "group" in keywords(asyncq.Task.options)
    assert "scheduled_at" in {f for f in asyncq.JobContext.__dataclass_fields__}
    assert asyncq.Retry(after=2).after == 2
    assert asyncq.Snooze(3).after == 3
    assert asyncq.Discard("gone").reason == "gone"


def test_bad_declarations_are_refused_before_anything_is_written() -> None:
    app = asyncq.App("postgresql://nowhere.invalid/x")

    async def f() -> None:
        pass

    with pytest.raises(ValueError):
        app.periodic(cron="61 * * * *")(f)
    with pytest.raises(asyncq.ConfigurationError, match="rate_limit"):
        app.task(name="t.rate", rate_limit="fast")(f)
    with pytest.raises(asyncq.ConfigurationError, match="concurrency"):
        app.task(name="t.conc", concurrency=0)(f)


def test_the_scale_and_failover_names() -> None:
    """``App(..., listen_dsn=...)`` and ``listen=False``; with ``prepare_threshold``, the
    options a PgBouncer in transaction mode needs. Bad values are refused at App()."""
    assert {"listen_dsn", "listen", "prepare_threshold"} <= keywords(asyncq.App)
    app = asyncq.App("postgresql://pgbouncer.invalid/x", listen_dsn="postgresql://db.invalid/x")
    assert app.listen and app.prepare_threshold == 5  # psycopg's own default
    assert not asyncq.App("postgresql://pgbouncer.invalid/x", listen=False).listen
    assert asyncq.App("postgresql://x.invalid/x", prepare_threshold=None).prepare_threshold is None
    for bad in (
        {"listen_dsn": "postgresql://db.invalid/x", "listen": False},
        {"listen_dsn": ""},
        {"listen": "no"},
        {"prepare_threshold": -1},
        {"prepare_threshold": True},
    ):
        with pytest.raises(asyncq.ConfigurationError):
            asyncq.App("postgresql://x.invalid/x", **bad)  # type: ignore[arg-type]
