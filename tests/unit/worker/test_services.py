"""How services run: transient database errors are reported and retried with a backoff,
anything else stops the worker."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from asyncq.worker import services
from asyncq.worker.observer import Observer


class Reported(Observer):
    def __init__(self) -> None:
        self.failures: list[tuple[str, str, float]] = []

    def service_failed(self, service: str, error: BaseException, retry_in: float) -> None:
        self.failures.append((service, type(error).__name__, retry_in))


def test_retrying_retries_transient_errors_until_the_call_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(services, "backoff_delay", lambda failures: 0.001 * failures)
    observer = Reported()
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise psycopg.OperationalError("server closed the connection")
        return "ok"

    assert asyncio.run(services.retrying("claim", flaky, observer)) == "ok"
    assert observer.failures == [
        ("claim", "OperationalError", 0.001),
        ("claim", "OperationalError", 0.002),
    ]


def test_retrying_lets_a_permanent_error_through() -> None:
    async def broken() -> None:
        raise psycopg.errors.UndefinedColumn("column claims does not exist")

    with pytest.raises(psycopg.errors.UndefinedColumn):
        asyncio.run(services.retrying("claim", broken, Reported()))


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.ProgramLimitExceeded("index row size 4016 exceeds btree maximum 2704"),
        psycopg.errors.StatementTooComplex("stack depth limit exceeded"),
        psycopg.errors.TooManyColumns("tables can have at most 1600 columns"),
        psycopg.errors.CantChangeRuntimeParam('parameter "wal_level" cannot be changed now'),
    ],
    ids=lambda error: type(error).__name__,
)
def test_retrying_lets_an_operational_error_no_retry_gets_past_through(
    monkeypatch: pytest.MonkeyPatch, error: psycopg.OperationalError
) -> None:
    monkeypatch.setattr(services, "backoff_delay", lambda failures: 0.001)
    calls = 0

    async def refused() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise error
        return "ok"

    with pytest.raises(type(error)):
        asyncio.run(services.retrying("claim", refused, Reported()))
    assert calls == 1


def test_every_reports_a_failure_and_tries_again_at_the_next_turn() -> None:
    observer = Reported()
    turns: list[int] = []

    async def beat() -> None:
        turns.append(len(turns))
        if len(turns) == 2:
            raise TimeoutError()
        if len(turns) == 4:
            raise asyncio.CancelledError()  # ends the test's loop

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(services.every("heartbeat", lambda: 0.001, beat, observer))
    assert turns == [0, 1, 2, 3]
    assert observer.failures == [("heartbeat", "TimeoutError", 0.001)]


def test_the_backoff_between_tries_stays_within_five_seconds() -> None:
    """However long the database was away, a service tries again within 5 s of its last
    failure: it is back within seconds of the database."""
    from asyncq.transient import backoff_delay

    delays = [backoff_delay(failures) for failures in range(1, 40) for _ in range(50)]
    assert min(delays) >= 0.25 and max(delays) <= 5.0
    assert max(backoff_delay(1) for _ in range(200)) <= 1.0  # the first tries come soon
