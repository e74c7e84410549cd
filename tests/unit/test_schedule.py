"""Declaring schedules: cron expressions and their slots, and what a declaration refuses
before anything is written (no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import asyncq
from asyncq.schedule import Cron


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("cron", "now", "latest", "following"),
    [
        ("*/5 * * * *", "2026-01-01T10:07:30", "2026-01-01T10:05", "2026-01-01T10:10"),
        ("*/5 * * * *", "2026-01-01T10:05:00", "2026-01-01T10:05", "2026-01-01T10:10"),
        ("*/5 * * * *", "2026-01-01T10:05:00.5", "2026-01-01T10:05", "2026-01-01T10:10"),
        ("* * * * *", "2026-01-01T10:04:59.999", "2026-01-01T10:04", "2026-01-01T10:05"),
        ("@hourly", "2026-01-01T10:07", "2026-01-01T10:00", "2026-01-01T11:00"),
        ("@daily", "2026-01-01T10:07", "2026-01-01T00:00", "2026-01-02T00:00"),
        ("@weekly", "2026-01-01T10:07", "2025-12-28T00:00", "2026-01-04T00:00"),
        ("@monthly", "2026-01-15T10:07", "2026-01-01T00:00", "2026-02-01T00:00"),
        ("@yearly", "2026-06-01T00:00", "2026-01-01T00:00", "2027-01-01T00:00"),
        ("@annually", "2026-06-01T00:00", "2026-01-01T00:00", "2027-01-01T00:00"),
        ("0 9 * * mon-fri", "2026-01-03T12:00", "2026-01-02T09:00", "2026-01-05T09:00"),
    ],
)
def test_latest_and_next_slots(cron: str, now: str, latest: str, following: str) -> None:
    parsed = Cron(cron)
    assert parsed.latest(at(now)) == at(latest)
    assert parsed.next_after(at(now)) == at(following)


def test_slots_in_a_time_zone_follow_its_clock_across_daylight_saving() -> None:
    paris = Cron("30 2 * * *", "Europe/Paris")
    # 2026-03-29: 02:00 becomes 03:00 in Paris; 02:30 does not exist and runs at 03:00
    # local (01:00 UTC), as Debian cron does; the day before, 02:30 is 01:30 UTC.
    assert paris.next_after(at("2026-03-28T00:00")) == at("2026-03-28T01:30")
    assert paris.next_after(at("2026-03-28T12:00")) == at("2026-03-29T01:00")
    assert paris.latest(at("2026-03-29T12:00")) == at("2026-03-29T01:00")
    # 2026-10-25: 03:00 becomes 02:00 again; 02:30 happens twice and runs once.
    assert paris.next_after(at("2026-10-24T12:00")) == at("2026-10-25T00:30")
    assert paris.next_after(at("2026-10-25T00:30")) == at("2026-10-26T01:30")


@pytest.mark.parametrize(
    "cron",
    ["", "* * * *", "* * * * * *", "61 * * * *", "* 24 * * *", "0 0 30 2 *", "@often", "x"],
)
def test_a_malformed_cron_expression_is_a_value_error(cron: str) -> None:
    with pytest.raises(ValueError, match="bad cron expression"):
        Cron(cron)


def test_an_unknown_time_zone_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        Cron("* * * * *", "Mars/Olympus")


def new_app() -> asyncq.App:
    return asyncq.App("postgresql://nowhere.invalid/none")  # never opened


def test_periodic_registers_a_task_and_its_schedule() -> None:
    app = new_app()

    @app.periodic("*/5 * * * *", queue="reports", kwargs={"region": "eu"}, tz="Europe/Paris")
    async def report(region: str, full: bool = False) -> None: ...

    assert isinstance(report, asyncq.Task) and report.queue == "reports"
    [schedule] = app.schedules.values()
    assert (schedule.name, schedule.task_name) == (report.name, report.name)
    assert (schedule.cron.expression, schedule.tz, schedule.queue) == (
        "*/5 * * * *",
        "Europe/Paris",
        "reports",
    )
    assert schedule.args == '{"region":"eu"}'


def test_a_task_may_have_several_schedules_each_named() -> None:
    app = new_app()

    @app.task
    async def sync(source: str) -> None: ...

    app.schedule(sync, cron="@hourly", kwargs={"source": "a"})
    app.schedule(sync, cron="*/10 * * * *", name="sync-b", kwargs={"source": "b"})
    assert {n: s.args for n, s in app.schedules.items()} == {
        sync.name: '{"source":"a"}',
        "sync-b": '{"source":"b"}',
    }
    # A second schedule of the same task without a name would take the first one's name
    # (and its slots): refused, with the way out in the message.
    with pytest.raises(ValueError, match=r"already declared \(give this schedule a name=\)"):
        app.schedule(sync, cron="@daily", kwargs={"source": "c"})
    with pytest.raises(ValueError, match="a schedule named 'sync-b' is already declared"):
        app.schedule(sync, cron="@daily", name="sync-b", kwargs={"source": "c"})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n": datetime.now()}, TypeError, "not JSON serializable"),
        ({}, TypeError, "missing a required argument: 'n'"),
        ({"n": 1, "other": 2}, TypeError, "unexpected keyword argument 'other'"),
        ([1], TypeError, "kwargs must be a mapping"),
    ],
)
def test_kwargs_that_do_not_fit_are_refused_at_declaration(
    kwargs: Any, error: type[Exception], match: str
) -> None:
    app = new_app()

    @app.task
    async def count(n: int) -> None: ...

    with pytest.raises(error, match=match):
        app.schedule(count, cron="* * * * *", kwargs=kwargs)
    assert app.schedules == {}


def test_bad_declarations_register_nothing() -> None:
    app = new_app()

    with pytest.raises(ValueError, match="bad cron expression"):

        @app.periodic("every minute")
        async def never() -> None: ...

    with pytest.raises(TypeError):

        @app.periodic("* * * * *", kwargs={"n": object()})
        async def nor(n: int) -> None: ...

    with pytest.raises(ValueError, match="unknown time zone"):

        @app.periodic("* * * * *", tz="Nowhere/Else")
        async def nor_this() -> None: ...

    assert app.tasks == {} and app.schedules == {}


def test_only_a_task_of_this_app_can_be_scheduled() -> None:
    app, other = new_app(), new_app()

    @other.task
    async def elsewhere() -> None: ...

    with pytest.raises(ValueError, match="not a task registered on this App"):
        app.schedule(elsewhere, cron="* * * * *")
