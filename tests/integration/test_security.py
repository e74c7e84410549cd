"""A row is data, never code: task names are looked up in the App's registry only,
arguments are JSON only, and a stored traceback carries no frame locals."""

from __future__ import annotations

import base64
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

import asyncq

pytestmark = pytest.mark.anyio

# Set by `unregistered_task` if anything ever calls it.
CALLED: list[Any] = []


async def unregistered_task(path: str) -> None:
    """A module-level coroutine function that is NOT registered on any App."""
    CALLED.append(path)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY))


def insert(db: Any, task_name: str, args: Any, max_attempts: int = 1) -> int:
    row = db.execute(
        "INSERT INTO asyncq_jobs (task_name, args, max_attempts)"
        " VALUES (%s, %s::jsonb, %s) RETURNING id",
        (task_name, json.dumps(args), max_attempts),
    ).fetchone()
    return int(row[0])


def outcome(db: Any, job_id: int) -> tuple[str, int, str]:
    row = db.execute(
        "SELECT status::text, attempts, coalesce(last_error, '') FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return (row[0], row[1], row[2])


class _Exploit:
    """Unpickling this would touch a file: the classic pickle payload."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


async def test_a_task_name_is_never_imported_or_called(
    app: asyncq.App, db: Any, drain: Any, tmp_path: Path
) -> None:
    ran: list[str] = []

    @app.task(name="registered")
    async def registered() -> None:
        ran.append("registered")

    marker = tmp_path / "side-effect"
    names_and_args: list[tuple[str, dict[str, Any]]] = [
        ("os.system", {"command": f"touch {marker}"}),
        ("posix.system", {"command": f"touch {marker}"}),
        ("subprocess.run", {"args": ["touch", str(marker)]}),
        ("builtins.eval", {"source": f"open({str(marker)!r}, 'w')"}),
        ("builtins.exec", {"source": f"open({str(marker)!r}, 'w')"}),
        ("builtins.__import__", {"name": "antigravity"}),
        ("pickle.loads", {"data": "gARLAS4="}),
        ("asyncq.app.App", {"dsn": "postgresql://nowhere/db"}),
        (f"{__name__}.unregistered_task", {"path": str(marker)}),
        (f"{__name__}:unregistered_task", {"path": str(marker)}),
        # The bound method that runs registered tasks, named by its import path.
        ("asyncq.task.Task.call_stored", {"stored_args": {}}),
    ]
    ids = {insert(db, name, args): name for name, args in names_and_args}
    await registered.defer()

    stats = await drain()

    assert ran == ["registered"]  # the worker went on with real work
    assert stats.given_back == len(ids)  # for a worker that knows them, if any
    assert CALLED == []
    assert not marker.exists()
    for job_id, name in ids.items():
        status, attempts, error = outcome(db, job_id)
        assert (status, attempts) == ("queued", 0), name
        assert error.startswith("asyncq.errors.TaskNotFound: unknown task"), error
        assert repr(name) in error


async def test_arguments_that_look_like_objects_stay_plain_data(
    app: asyncq.App, db: Any, drain: Any, tmp_path: Path
) -> None:
    received: list[dict[str, Any]] = []

    @app.task(name="echo", max_attempts=1)
    async def echo(**kwargs: Any) -> None:
        received.append(kwargs)

    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Exploit(str(marker)), protocol=0)
    assert b"system" in payload
    args = {
        "pickle_b64": base64.b64encode(pickle.dumps(_Exploit(str(marker)))).decode(),
        "pickle_text": payload.decode("latin-1"),
        "object": {"__class__": "os.system", "__reduce__": ["os.system", [f"touch {marker}"]]},
        "jsonpickle": {"py/object": "os.system", "py/reduce": [{"py/function": "os.system"}]},
        "typed": {"__type__": "datetime.datetime", "__value__": "2026-01-01T00:00:00"},
        "numbers": [1, 2.5, None, True],
    }
    stored = insert(db, "echo", args)
    deferred = await echo.defer(**args)

    await drain()

    assert received == [args, args]  # exactly the JSON, as dicts, lists and strings
    for value in received:
        assert type(value["object"]) is dict
        assert type(value["pickle_text"]) is str
    assert not marker.exists()
    assert outcome(db, stored)[0] == outcome(db, deferred)[0] == "done"


async def test_stored_tracebacks_hold_no_frame_locals(app: asyncq.App, db: Any, drain: Any) -> None:
    card = "4111-1111-1111-1111"

    def check(pin: str, amount: int) -> None:
        limit = {"pin": pin, "amount": amount}
        if limit["amount"] > 0:
            raise RuntimeError("card declined")

    @app.task(name="charge", max_attempts=1)
    async def charge(card_number: str) -> None:
        pin = "pin-" + card_number[::-1]
        check(pin, 10)

    job_id = await charge.defer(card)
    await drain()

    status, _, error = outcome(db, job_id)
    assert status == "failed"
    # The exception and where it came from ...
    assert error.startswith("RuntimeError: card declined")
    assert "Traceback (most recent call last)" in error
    assert "in charge" in error and "in check" in error
    # ... but no values: neither the argument nor the locals derived from it.
    assert card not in error
    assert card[::-1] not in error
    assert "pin-" not in error
    assert "amount': 10" not in error
