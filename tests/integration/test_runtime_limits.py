"""Limits kept in the database: what `App.set_limits` writes, how the overrides of a task
and of its queue stack over the code's, what bad input gets (an error, and nothing
written), what an unknown name gets (a warning, and the override kept); the limiter's
reading of them, as a worker's claims take them."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.errors import ConfigurationError
from asyncq.limits import ClaimLimits, Rate, TaskLimits
from asyncq.worker.limiter import Limiter
from asyncq.worker.observer import Observer

Db = psycopg.Connection[Any]
pytestmark = pytest.mark.anyio


def register(app: asyncq.App) -> None:
    @app.task(concurrency=1, queue="mail")
    async def send(n: int) -> None: ...

    @app.task(queue="mail")
    async def bounce(n: int) -> None: ...

    @app.task(rate_limit="5/s", group_concurrency=2)
    async def report(n: int) -> None: ...


def by_name(found: list[asyncq.admin.LimitInfo]) -> dict[str, asyncq.admin.LimitInfo]:
    return {f.name: f for f in found}


async def test_overrides_stack_over_the_code_and_reset_returns_to_it(app: asyncq.App) -> None:
    register(app)
    send, bounce, report = (t for t in app.tasks)
    found = by_name(await app.limits())
    assert (found[send].concurrency, found[send].concurrency_source) == (1, "code")
    assert (found[bounce].concurrency, found[bounce].concurrency_source) == (None, None)
    assert (found[report].rate_limit, found[report].rate_limit_source) == ("5/s", "code")

    await app.set_limits("mail", concurrency=5)
    await app.set_limits(send, concurrency=3)
    await app.set_limits(report, rate_limit="20/m")
    await app.set_limits(report, group_concurrency=4)  # keeps the rate set before
    found = by_name(await app.limits())
    assert (found[send].concurrency, found[send].concurrency_source) == (3, "override")
    assert (found[bounce].concurrency, found[bounce].concurrency_source) == (5, "queue override")
    assert (found[report].rate_limit, found[report].rate_limit_source) == ("20/m", "override")
    assert (found[report].group_concurrency, found[report].group_concurrency_source) == (
        4,
        "override",
    )
    assert (found["mail"].kind, found["mail"].concurrency, found["mail"].known) == (
        "queue",
        5,
        True,
    )

    assert await app.reset_limits(send) is True
    assert await app.reset_limits(send) is False
    found = by_name(await app.limits())
    assert (found[send].concurrency, found[send].concurrency_source) == (5, "queue override")
    assert await app.reset_limits("mail") is True
    found = by_name(await app.limits())
    assert (found[send].concurrency, found[send].concurrency_source) == (1, "code")
    assert "mail" not in found


@pytest.mark.parametrize(
    "limits",
    [
        {"concurrency": 0},
        {"concurrency": -2},
        {"concurrency": True},
        {"group_concurrency": 0},
        {"rate_limit": "ten/s"},
        {"rate_limit": "0/s"},
        {"rate_limit": "10/d"},
        {},
    ],
)
async def test_bad_limits_raise_and_write_nothing(
    app: asyncq.App, db: Db, limits: dict[str, Any]
) -> None:
    register(app)
    send = next(iter(app.tasks))
    await app.set_limits(send, concurrency=2)
    with pytest.raises(ConfigurationError):
        await app.set_limits(send, **limits)
    rows = db.execute("SELECT name, concurrency, rate, group_concurrency FROM asyncq_limits")
    assert rows.fetchall() == [(send, 2, None, None)]


async def test_an_unknown_name_warns_and_is_kept(
    app: asyncq.App, caplog: pytest.LogCaptureFixture
) -> None:
    register(app)
    with caplog.at_level(logging.WARNING, logger="asyncq"):
        await app.set_limits("elsewhere.task", concurrency=7)
    assert any("'elsewhere.task'" in r.getMessage() for r in caplog.records), caplog.text
    found = by_name(await app.limits())
    assert (found["elsewhere.task"].concurrency, found["elsewhere.task"].known) == (7, False)


class Seen(Observer):
    def __init__(self) -> None:
        self.changes: list[dict[str, Any]] = []
        self.at_start: list[bool] = []

    def limits_changed(self, in_force: Any, *, at_start: bool = False) -> None:
        self.changes.append(dict(in_force))
        self.at_start.append(at_start)


async def test_the_limiter_gives_the_claims_the_limits_in_force(app: asyncq.App) -> None:
    register(app)
    send, bounce, report = (t for t in app.tasks)
    applied: list[ClaimLimits | None] = []
    seen = Seen()
    limiter = Limiter(
        pool=app.pool,
        store=app.store,
        tasks=[(n, t.queue, t.limits) for n, t in app.tasks.items()],
        apply=applied.append,
        poll_interval=60,
        observer=seen,
    )
    await limiter._read()
    assert applied[-1] is not None
    assert applied[-1].names == sorted([send, report]) and applied[-1].concurrency[0] in (1, None)
    assert seen.at_start == [True]  # the code's limits, as the worker started

    await app.set_limits("mail", concurrency=4)
    await limiter._read()
    claimed = applied[-1]
    assert claimed is not None
    assert dict(zip(claimed.names, claimed.concurrency, strict=True)) == {
        send: 4,
        bounce: 4,
        report: None,
    }
    assert seen.changes[-1][bounce].limits == TaskLimits(concurrency=4)
    assert seen.at_start == [True, False]

    count = len(applied)
    await limiter._read()  # nothing changed: nothing applied
    assert len(applied) == count

    await app.reset_limits("mail")
    await limiter._read()
    claimed = applied[-1]
    assert claimed is not None and claimed.names == sorted([send, report])
    assert seen.changes[-1][report].limits.rate == Rate(5, 1.0)


async def test_without_any_limit_the_claims_are_the_plain_ones(app: asyncq.App) -> None:
    @app.task
    async def plain(n: int) -> None: ...

    applied: list[ClaimLimits | None] = []
    limiter = Limiter(
        pool=app.pool,
        store=app.store,
        tasks=[(n, t.queue, t.limits) for n, t in app.tasks.items()],
        apply=applied.append,
        poll_interval=60,
        observer=Observer(),
    )
    await limiter._read()
    assert applied == [None]
    await app.set_limits(plain.name, concurrency=2)
    await limiter._read()
    assert applied[-1] is not None and applied[-1].names == [plain.name]
    await app.reset_limits(plain.name)
    await limiter._read()
    assert applied[-1] is None
