"""The package surface: exports, error hierarchy, and what needs no database."""

from __future__ import annotations

import inspect
import types

import pytest

import asyncq

pytestmark = pytest.mark.anyio

CONTRACT_NAMES = {"App", "Task", "Backoff", "current_job", "NotInJob"}


def test_all_lists_exactly_the_public_names() -> None:
    assert len(asyncq.__all__) == len(set(asyncq.__all__))
    for name in asyncq.__all__:
        assert hasattr(asyncq, name), name
    public = {
        name
        for name, value in vars(asyncq).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(asyncq.__all__) - {"__version__"}
    assert set(asyncq.__all__) >= CONTRACT_NAMES


def test_star_import_gives_the_all_names() -> None:
    namespace: dict[str, object] = {}
    exec("from asyncq import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(asyncq.__all__)


def test_version_is_a_string() -> None:
    assert isinstance(asyncq.__version__, str) and asyncq.__version__


def test_error_hierarchy() -> None:
    errors = [
        value
        for value in vars(asyncq).values()
        if inspect.isclass(value) and issubclass(value, BaseException)
    ]
    assert {e.__name__ for e in errors} >= {
        "AsyncqError",
        "ConfigurationError",
        "InvalidName",
        "ArgumentsError",
        "PayloadTooLarge",
        "AppNotOpen",
        "DatabaseUnavailable",
        "SchemaNotMigrated",
        "TaskNotFound",
        "TaskArgumentsMismatch",
        "NotInJob",
    }
    control = {asyncq.JobControl, asyncq.Retry, asyncq.Snooze, asyncq.Discard}
    for error in errors:
        if error in control:  # what a task raises to steer its job, not an asyncq error
            assert issubclass(error, asyncq.JobControl) and not issubclass(
                error, asyncq.AsyncqError
            )
            continue
        assert issubclass(error, asyncq.AsyncqError)
        assert str(error()), f"{error.__name__} has no default message"
    assert issubclass(asyncq.InvalidName, ValueError)
    assert issubclass(asyncq.InvalidName, asyncq.ConfigurationError)
    assert issubclass(asyncq.ArgumentsError, TypeError)
    assert issubclass(asyncq.PayloadTooLarge, asyncq.ArgumentsError)
    assert "asyncq migrate" in str(asyncq.SchemaNotMigrated())


def test_status_values_match_the_table() -> None:
    assert {s.value for s in asyncq.Status} == {
        "queued",
        "running",
        "waiting",
        "done",
        "failed",
        "cancelled",
    }
    assert asyncq.Status.DONE == "done"


def test_current_job_outside_a_job_raises_not_in_job() -> None:
    with pytest.raises(asyncq.NotInJob):
        asyncq.current_job()


def test_app_does_not_connect_until_opened() -> None:
    app = asyncq.App("postgresql://nobody:pw@127.0.0.1:1/none")
    with pytest.raises(asyncq.AppNotOpen):
        _ = app.pool
    with pytest.raises(asyncq.AppNotOpen):
        _ = app.dsn


@pytest.mark.parametrize(
    "options",
    [
        {"pool_min_size": -1},
        {"pool_min_size": 5, "pool_max_size": 2},
        {"pool_max_size": 0},
        {"max_args_bytes": 1},
    ],
)
def test_bad_app_options_are_configuration_errors(options: dict[str, int]) -> None:
    with pytest.raises(asyncq.ConfigurationError):
        asyncq.App("postgresql://unused", **options)  # type: ignore[arg-type]


def test_task_registration_and_default_name() -> None:
    app = asyncq.App("postgresql://unused")

    @app.task
    async def plain(x: int) -> int:
        return x

    @app.task(queue="q", max_attempts=9, name="custom.name", priority=3)
    async def configured() -> None:
        pass

    assert isinstance(plain, asyncq.Task)
    assert plain.name == f"{__name__}.test_task_registration_and_default_name.<locals>.plain"
    assert (plain.queue, plain.max_attempts) == ("default", 3)
    assert (configured.name, configured.queue, configured.max_attempts) == ("custom.name", "q", 9)
    assert app.tasks == {plain.name: plain, "custom.name": configured}


async def test_calling_a_task_runs_the_coroutine_without_a_database() -> None:
    app = asyncq.App("postgresql://nobody@127.0.0.1:1/none")
    calls: list[tuple[int, int]] = []

    @app.task
    async def add(a: int, b: int = 10) -> int:
        calls.append((a, b))
        return a + b

    assert await add(1, 2) == 3
    assert await add(5) == 15
    assert calls == [(1, 2), (5, 10)]


@pytest.mark.parametrize("max_attempts", [0, -1, 1.5, "3"])
def test_bad_max_attempts_is_refused(max_attempts: object) -> None:
    app = asyncq.App("postgresql://unused")
    with pytest.raises(ValueError):
        app.task(max_attempts=max_attempts)(_noop)  # type: ignore[call-overload]


async def _noop() -> None:
    pass


@pytest.mark.parametrize(
    "options",
    [{"concurrency": 0}, {"batch_size": 0}, {"lease": 0}, {"grace": -1}, {"queues": [""]}],
)
async def test_bad_worker_options_are_refused_before_connecting(options: dict[str, object]) -> None:
    app = asyncq.App("postgresql://nobody@127.0.0.1:1/none", connect_timeout=1)
    with pytest.raises(asyncq.ConfigurationError):
        await app.run_worker(drain=True, handle_signals=False, **options)  # type: ignore[arg-type]
