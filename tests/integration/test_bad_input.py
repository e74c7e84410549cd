"""Bad input at defer is refused before anything is written; odd names round-trip."""

from __future__ import annotations

import datetime as dt
import decimal
import random
import re
import secrets
import uuid
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.task import MAX_UNIQUE_KEY_BYTES
from asyncq.transient import is_transient

pytestmark = pytest.mark.anyio

HOSTILE_NAMES = [
    "q'; DROP TABLE asyncq_jobs; --",
    "очередь-キュー",
    'quote"double',
    "back\\slash %s %(x)s {}",
    "emoji 🙂 and spaces",
    "x" * 200,
]


def count(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0])


def stable_id(value: Any) -> str:
    """A test id that does not change between runs (no memory addresses)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {1, 2},
        dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        dt.date(2024, 1, 1),
        float("nan"),
        float("inf"),
        b"bytes",
        decimal.Decimal("1.5"),
        uuid.UUID(int=1),
        {"nested": [object()]},
        {(1, 2): "tuple key"},
        "NUL \x00 inside",
    ],
    ids=stable_id,
)
async def test_unserialisable_arguments_raise_type_error_and_write_nothing(
    app: asyncq.App, db: Any, value: Any
) -> None:
    @app.task
    async def store(value: Any) -> None:
        pass

    with pytest.raises(asyncq.ArgumentsError) as info:
        await store.defer(value)
    assert isinstance(info.value, TypeError)
    with pytest.raises(TypeError):
        await store.defer_many([{"value": 1}, {"value": value}])
    with pytest.raises(TypeError):
        await store.options(priority=1).defer(value=value)
    assert count(db) == 0


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),  # missing
        ((1, 2, 3), {}),  # too many positional
        ((1,), {"b": 2, "c": 3}),  # unknown keyword
        ((1,), {"a": 1}),  # given twice
    ],
)
async def test_arguments_not_fitting_the_signature_raise_and_write_nothing(
    app: asyncq.App, db: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    @app.task
    async def pair(a: int, b: int = 0) -> None:
        pass

    with pytest.raises(TypeError):
        await pair.defer(*args, **kwargs)
    assert count(db) == 0


async def test_payload_over_the_cap_raises_and_writes_nothing(dsn: str, db: Any) -> None:
    async with asyncq.App(dsn, max_args_bytes=100) as small:

        @small.task
        async def blob(data: str) -> None:
            pass

        with pytest.raises(asyncq.PayloadTooLarge) as info:
            await blob.defer("x" * 200)
        assert isinstance(info.value, TypeError)
        assert "100" in str(info.value)
        # Multi-byte characters count by their UTF-8 size.
        with pytest.raises(asyncq.PayloadTooLarge):
            await blob.defer("é" * 45)
        with pytest.raises(asyncq.PayloadTooLarge):
            await blob.defer_many([{"data": "ok"}, {"data": "y" * 200}])
        assert count(db) == 0
        # Just under the cap is fine: '{"data":"…"}' is 11 bytes plus the text.
        job_id = await blob.defer("z" * 89)
    assert db.execute("SELECT args FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone() == (
        {"data": "z" * 89},
    )


@pytest.mark.parametrize(
    "name", ["", "x" * 201, "line\nbreak", "tab\there", "nul\x00", "del\x7f", "\x1b[31m"]
)
async def test_bad_queue_names_are_refused(app: asyncq.App, db: Any, name: str) -> None:
    @app.task
    async def job() -> None:
        pass

    with pytest.raises(asyncq.InvalidName) as info:
        job.options(queue=name)
    assert isinstance(info.value, ValueError)

    async def other() -> None:
        pass

    with pytest.raises(asyncq.InvalidName):
        app.task(queue=name)(other)
    if name:  # an empty task name means the default name
        with pytest.raises(asyncq.InvalidName):
            app.task(name=name)(other)
    assert list(app.tasks) == [job.name]
    with pytest.raises(asyncq.InvalidName):
        await app.run_worker(queues=[name], drain=True, handle_signals=False)
    assert count(db) == 0


@pytest.mark.parametrize("name", HOSTILE_NAMES)
async def test_odd_queue_names_round_trip_and_are_served(
    app: asyncq.App, db: Any, drain: Any, name: str
) -> None:
    seen: list[str] = []

    @app.task(queue=name)
    async def job() -> None:
        seen.append(asyncq.current_job().queue)

    job_id = await job.defer()
    other = await job.options(queue="plain").defer()
    assert db.execute("SELECT queue FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone() == (
        name,
    )
    ids = await job.options(queue=name).defer_many([{}, {}])
    stats = await drain(queues=[name])
    assert stats.done == 3
    assert seen == [name] * 3
    statuses = dict(db.execute("SELECT id, status::text FROM asyncq_jobs").fetchall())
    assert statuses == {job_id: "done", ids[0]: "done", ids[1]: "done", other: "queued"}


@pytest.mark.parametrize("name", HOSTILE_NAMES)
async def test_odd_task_names_round_trip_and_run(
    app: asyncq.App, db: Any, drain: Any, name: str
) -> None:
    seen: list[str] = []

    @app.task(name=name)
    async def job(text: str) -> None:
        seen.append(f"{asyncq.current_job().task_name}|{text}")

    job_id = await job.defer(name)
    row = db.execute("SELECT task_name, args FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row == (name, {"text": name})
    await drain()
    assert seen == [f"{name}|{name}"]


async def test_odd_unique_keys_round_trip(app: asyncq.App, db: Any) -> None:
    @app.task
    async def job() -> None:
        pass

    for key in HOSTILE_NAMES:
        first = await job.options(unique_key=key).defer()
        assert await job.options(unique_key=key).defer() == first
    assert count(db) == len(HOSTILE_NAMES)


async def test_a_unique_key_over_the_limit_is_refused_before_anything_is_written(
    app: asyncq.App, db: Any
) -> None:
    @app.task(name="bad_input.keyed")
    async def keyed() -> None:
        pass

    @app.task(name="bad_input.keyed_sync")
    def keyed_sync() -> None:
        pass

    # At the limit, and as little compressible as text gets: PostgreSQL indexes it.
    ascii_key = secrets.token_hex(MAX_UNIQUE_KEY_BYTES // 2)
    wide_key = "".join(random.choice("éλжあ🙂") for _ in range(MAX_UNIQUE_KEY_BYTES))
    wide_key = wide_key.encode()[:MAX_UNIQUE_KEY_BYTES].decode(errors="ignore")
    first = await keyed.options(unique_key=ascii_key).defer()
    assert await keyed.options(unique_key=ascii_key).defer() == first
    assert keyed_sync.options(unique_key=wide_key).defer_sync() > first
    assert count(db) == 2

    too_long = "x" * 4000
    over_by_one = "é" * (MAX_UNIQUE_KEY_BYTES // 2) + "x"
    for key, size in ((too_long, 4000), (over_by_one, MAX_UNIQUE_KEY_BYTES + 1)):
        refused = rf"unique_key must be at most {MAX_UNIQUE_KEY_BYTES} bytes of UTF-8, not {size}"
        with pytest.raises(ValueError, match=refused):
            keyed.options(unique_key=key)
        with pytest.raises(ValueError, match=refused):
            await keyed.options(unique_key=key).defer()
        with pytest.raises(ValueError, match=refused):
            await keyed.options(unique_key=key).defer_many([{}])
        with pytest.raises(ValueError, match=refused):
            keyed_sync.options(unique_key=key).defer_sync()
    assert count(db) == 2


def test_an_error_no_retry_gets_past_is_not_transient(db: Any) -> None:
    key = secrets.token_urlsafe(3000)  # ~4,000 characters that do not compress
    with pytest.raises(psycopg.errors.ProgramLimitExceeded) as caught:
        db.execute(
            "INSERT INTO asyncq_jobs (task_name, args, unique_key) VALUES ('t', '{}', %s)", (key,)
        )
    assert isinstance(caught.value, psycopg.OperationalError)
    assert not is_transient(caught.value)
    assert is_transient(psycopg.errors.SerializationFailure())
    assert is_transient(psycopg.errors.AdminShutdown())


async def test_duplicate_task_names_are_refused(app: asyncq.App) -> None:
    @app.task(name="same")
    async def one() -> None:
        pass

    with pytest.raises(asyncq.ConfigurationError):

        @app.task(name="same")
        async def two() -> None:
            pass


async def test_what_is_not_a_function_is_refused(app: asyncq.App) -> None:
    async def generator() -> Any:
        yield 1

    with pytest.raises(TypeError):
        app.task(generator)
    with pytest.raises(TypeError):
        app.task(name="not.a.function")(42)  # type: ignore[call-overload]


async def test_a_backslash_before_u0000_is_text_not_a_nul(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    seen: list[str] = []

    @app.task(name="bad_input.path")
    async def path(text: str) -> None:
        seen.append(text)

    text = "C:\\u0000dir and \\\\u0000 too"  # backslashes and the letters u0000, no NUL
    await path.defer(text)
    await path.defer_many([{"text": text}])
    await drain()
    assert seen == [text, text]
    with pytest.raises(asyncq.ArgumentsError, match="NUL"):
        await path.defer("a real \x00")
    with pytest.raises(asyncq.ArgumentsError, match="NUL"):
        await path.defer("\\\x00")
    with pytest.raises(asyncq.ArgumentsError, match="NUL"):
        await path.defer_many([{"text": "ok"}, {"text": "\\\\\x00"}])
    assert count(db) == 2


@pytest.mark.parametrize(
    "options",
    [
        {"lease": float("inf")},
        {"lease": float("nan")},
        {"lease": 0},
        {"lease": 1e12},
        {"poll_interval": 0},
        {"poll_interval": float("inf")},
        {"grace": -1},
        {"grace": float("nan")},
        {"concurrency": 0},
        {"concurrency": 1.5},
        {"batch_size": 0},
        {"listener_health_timeout": 0},
    ],
    ids=lambda options: " ".join(f"{k}={v}" for k, v in options.items()),
)
async def test_bad_worker_options_are_refused_before_anything_opens(
    dsn: str, options: dict[str, Any]
) -> None:
    app = asyncq.App(dsn)
    name = next(iter(options))
    with pytest.raises(asyncq.ConfigurationError, match=name):
        await app.run_worker(**options)
    with pytest.raises(asyncq.AppNotOpen):
        app.pool  # noqa: B018 - nothing was opened, so nothing leaked
