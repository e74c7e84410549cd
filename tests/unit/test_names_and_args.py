"""Name validation and argument encoding, checked before anything touches a database."""

from __future__ import annotations

import datetime as dt
import json
import re
from types import MappingProxyType
from typing import Any

import pytest

import asyncq

pytestmark = pytest.mark.anyio

# Never opened: every check here must happen before a connection is needed.
UNOPENED = "postgresql://nobody@127.0.0.1:1/none"


def stable_id(value: Any) -> str:
    """A test id that does not change between runs (no memory addresses)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


@pytest.fixture
def app() -> asyncq.App:
    return asyncq.App(UNOPENED, max_args_bytes=200)


@pytest.mark.parametrize(
    "name",
    ["", "x" * 201, "a\nb", "a\rb", "a\tb", "a\x00b", "\x7f", "\x1f", None, 5],
    ids=repr,
)
def test_bad_queue_names(app: asyncq.App, name: Any) -> None:
    with pytest.raises(asyncq.InvalidName) as info:
        app.task(queue=name)(_noop)
    assert isinstance(info.value, ValueError)
    assert app.tasks == {}


@pytest.mark.parametrize(
    "name",
    ["x" * 200, "q'; DROP TABLE asyncq_jobs; --", "очередь-キュー", "a b", "ü", "%s", "{x}"],
)
def test_good_queue_names(app: asyncq.App, name: str) -> None:
    task = app.task(queue=name)(_noop)
    assert task.queue == name
    assert task.options(queue=name) is not None


@pytest.mark.parametrize("name", ["", "x" * 201, "a\nb", "a\x00b"], ids=repr)
def test_bad_task_names(app: asyncq.App, name: str) -> None:
    with pytest.raises(asyncq.InvalidName):
        app.task(name=name)(_noop)


def test_unique_key_with_nul_is_rejected(app: asyncq.App) -> None:
    with pytest.raises(ValueError, match="NUL"):
        app.task(_noop).options(unique_key="a\x00b")


def test_bad_queue_name_in_options(app: asyncq.App) -> None:
    task = app.task(_noop)
    for name in ["", "x" * 201, "bell\x07"]:
        with pytest.raises(asyncq.InvalidName):
            task.options(queue=name)


async def _noop() -> None:
    pass


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {1, 2},
        frozenset(),
        dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        dt.timedelta(1),
        float("nan"),
        float("-inf"),
        b"x",
        [1, object()],
        {"k": {2, 3}},
        "nul\x00",
    ],
    ids=stable_id,
)
async def test_unserialisable_arguments_fail_before_any_connection(
    app: asyncq.App, value: Any
) -> None:
    @app.task
    async def keep(value: Any) -> None:
        pass

    # The App is not open: an ArgumentsError (not AppNotOpen) proves nothing was attempted.
    with pytest.raises(asyncq.ArgumentsError) as info:
        await keep.defer(value)
    assert isinstance(info.value, TypeError)
    with pytest.raises(asyncq.ArgumentsError):
        await keep.defer_many([{"value": value}])


async def test_arguments_not_fitting_fail_before_any_connection(app: asyncq.App) -> None:
    @app.task
    async def pair(a: int, *, b: int) -> None:
        pass

    for args, kwargs in [((), {"b": 1}), ((1,), {}), ((1, 2), {"b": 1}), ((1,), {"b": 1, "c": 2})]:
        with pytest.raises(TypeError, match="pair"):
            await pair.defer(*args, **kwargs)
    with pytest.raises(TypeError):
        await pair.defer_many([{"a": 1}])
    # One call of many that does not fit: the one missing a parameter, or naming one the
    # function does not have, among calls that fit.
    for odd in [{"a": 1}, {"a": 1, "b": 2, "c": 3}, {1: 1, "a": 1, "b": 2}]:
        with pytest.raises(TypeError, match="pair"):
            await pair.defer_many([{"a": 1, "b": 2}, odd, {"a": 3, "b": 4}])
    with pytest.raises(asyncq.AppNotOpen):
        await pair.defer(1, b=2)  # fits: now it needs the database
    with pytest.raises(asyncq.AppNotOpen):
        await pair.defer_many([{"a": 1, "b": 2}, MappingProxyType({"a": 3, "b": 4})])


async def test_payload_cap_counts_utf8_bytes(app: asyncq.App) -> None:
    @app.task
    async def blob(data: str) -> None:
        pass

    overhead = len('{"data":""}')
    assert len(blob.encode(("a" * (200 - overhead),), {}).encode()) == 200
    with pytest.raises(asyncq.PayloadTooLarge):
        blob.encode(("a" * (201 - overhead),), {})
    with pytest.raises(asyncq.PayloadTooLarge):
        blob.encode(("é" * 100,), {})  # 100 characters, 200 bytes of text
    with pytest.raises(asyncq.PayloadTooLarge):
        await blob.defer("x" * 500)


async def test_arguments_that_refer_to_themselves_are_refused(app: asyncq.App) -> None:
    @app.task
    async def keep(value: Any) -> None:
        pass

    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(asyncq.ArgumentsError, match="refer to themselves"):
        await keep.defer(loop)
    with pytest.raises(asyncq.ArgumentsError):
        await keep.defer_many([{"value": 1}, {"value": loop}])


def test_many_jobs_encode_as_one_array_each_job_checked_alone(app: asyncq.App) -> None:
    @app.task
    async def blob(data: str) -> None:
        pass

    # Together far over the cap of 200 bytes, each job well under it.
    calls = [{"data": "x" * 100} for _ in range(50)]
    assert json.loads(blob.encode_many(calls)) == calls
    # Any mapping will do, and a job's own error names what is wrong with it.
    assert json.loads(blob.encode_many([MappingProxyType({"data": "é"})])) == [{"data": "é"}]
    with pytest.raises(asyncq.PayloadTooLarge):
        blob.encode_many([*calls, {"data": "y" * 200}])
    with pytest.raises(asyncq.ArgumentsError, match="NUL"):
        blob.encode_many([*calls, {"data": "a\x00b"}])
    with pytest.raises(TypeError, match="mapping"):
        blob.encode_many([{"data": "ok"}, ["data", "no"]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="blob"):
        blob.encode_many([{"data": "ok"}, {"date": "typo"}])


def test_encoding_binds_positional_arguments_to_names(app: asyncq.App) -> None:
    @app.task
    async def send(to: str, subject: str, /, body: str = "", *, cc: str | None = None) -> None:
        pass

    encoded = json.loads(send.encode(("a@x", "hi"), {"body": "text", "cc": "b@x"}))
    assert encoded == {"to": "a@x", "subject": "hi", "body": "text", "cc": "b@x"}
    assert json.loads(send.encode(("a@x", "hi"), {})) == {"to": "a@x", "subject": "hi"}


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, "b"), {}),
        ((1, "b", 3, 4), {}),
        ((1, "b", 3), {"c": {"x": [1]}, "extra": True}),
        ((1,), {"b": "kw"}),
    ],
)
async def test_stored_arguments_call_the_function_as_deferred(
    app: asyncq.App, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    seen: list[Any] = []

    @app.task
    async def shapes(a: int, /, b: str, *rest: int, c: Any = None, **extra: Any) -> None:
        seen.append((a, b, rest, c, extra))

    await shapes.call_stored(json.loads(shapes.encode(args, kwargs)))
    await shapes(*args, **kwargs)
    assert seen[0] == seen[1]


@pytest.mark.parametrize(
    "stored",
    [[1], "text", None, 3, {"a": 1, "zzz": 2}, {}, {"b": 1}],
    ids=repr,
)
def test_stored_arguments_that_do_not_fit_are_a_mismatch(app: asyncq.App, stored: Any) -> None:
    @app.task
    async def pos(a: int, /, b: int = 0) -> None:
        pass

    with pytest.raises(asyncq.TaskArgumentsMismatch):
        pos.call_stored(stored)


def test_stored_positional_only_gap_is_a_mismatch(app: asyncq.App) -> None:
    @app.task
    async def two(a: int = 1, b: int = 2, /) -> None:
        pass

    with pytest.raises(asyncq.TaskArgumentsMismatch):
        two.call_stored({"b": 5})  # must not silently become a=5
    two.call_stored({"a": 5}).close()
    two.call_stored({}).close()
