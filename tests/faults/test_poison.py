"""Poison input through a real worker process: jobs written with plain SQL that name
unknown tasks, carry arguments that do not fit, or run tasks that raise SystemExit or
KeyboardInterrupt. Each becomes a recorded failure (retried, then failed, with a
last_error naming the problem) or runs correctly; the worker keeps running, logs no
traceback, and runs a normal job afterwards. Oversized arguments are refused at defer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

import asyncq
from tests.harness.app import NOOP, ODD_NAME, RAISE_KEYBOARD_INTERRUPT, RAISE_SYSTEM_EXIT, TAKES
from tests.harness.jobs import job_row, status_of
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

UNKNOWN_ODD = ODD_NAME + " (not registered)"

# name: (task_name, args as JSON text, what last_error must contain)
# Jobs of tasks the worker does not know: given back for a worker that knows them.
UNKNOWN = {"unknown task", "unknown odd name"}
POISON = {
    "unknown task": ("no.such.task", "{}", "TaskNotFound: unknown task 'no.such.task'"),
    "unknown odd name": (UNKNOWN_ODD, "{}", f"TaskNotFound: unknown task {UNKNOWN_ODD!r}"),
    "missing argument": (
        TAKES,
        '{"a": 1}',
        "TaskArgumentsMismatch: arguments do not fit takes: takes() missing 1 required"
        " positional argument: 'b'",
    ),
    "extra argument": (
        TAKES,
        '{"a": 1, "b": "x", "c": 2}',
        "TaskArgumentsMismatch: arguments do not fit takes:"
        " takes() got an unexpected keyword argument 'c'",
    ),
    "JSON array": (
        TAKES,
        '[1, "x"]',
        "TaskArgumentsMismatch: arguments must be a JSON object keyed by parameter name, not list",
    ),
    "JSON string": (
        TAKES,
        '"a; DROP TABLE asyncq_jobs"',
        "TaskArgumentsMismatch: arguments must be a JSON object keyed by parameter name, not str",
    ),
    "JSON null": (
        TAKES,
        "null",
        "TaskArgumentsMismatch: arguments must be a JSON object keyed by parameter name,"
        " not NoneType",
    ),
    "SystemExit": (RAISE_SYSTEM_EXIT, "{}", "SystemExit: 3"),
    "KeyboardInterrupt": (RAISE_KEYBOARD_INTERRUPT, "{}", "KeyboardInterrupt"),
}
RUN_ONCE = {"SystemExit", "KeyboardInterrupt"}  # the others never reach the function
GOOD = {
    "odd name": (ODD_NAME, '{"text": "ünïcødé ✓ \'\\";"}'),
    "plain": (TAKES, '{"a": 1, "b": "x"}'),
}


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def insert(db: psycopg.Connection[Any], task_name: str, args: str) -> int:
    row = db.execute(
        "INSERT INTO asyncq_jobs (task_name, args, max_attempts) VALUES (%s, %s::jsonb, 2)"
        " RETURNING id",
        (task_name, args),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_poison_jobs_fail_on_the_record_and_the_worker_goes_on(
    db: psycopg.Connection[Any], workers: Workers, ledger: Ledger
) -> None:
    worker = workers.start(lease=5)
    poison = {name: insert(db, task, args) for name, (task, args, _) in POISON.items()}
    good = {name: insert(db, task, args) for name, (task, args) in GOOD.items()}

    def settled(job_id: int, name: str) -> bool:
        row = job_row(db, job_id)
        if name in UNKNOWN:  # given back, uncounted, for a worker that knows the task
            return row["unknown_since"] is not None
        return str(row["status"]) == "failed"

    wait_until(
        lambda: (
            all(settled(i, name) for name, i in poison.items())
            and all(status_of(db, i) == "done" for i in good.values())
        ),
        30,
        "every poison job to fail (or be given back) and the good ones to be done",
    )
    for name, job_id in poison.items():
        row = job_row(db, job_id)
        expected = POISON[name][2]
        if name in UNKNOWN:
            assert (str(row["status"]), row["attempts"]) == ("queued", 0), (name, row)
        else:
            assert row["attempts"] == 2, (name, row)
            assert row["finished_at"] is not None, name
        assert expected in row["last_error"].splitlines()[0], (name, row["last_error"])
        runs = 2 if name in RUN_ONCE else 0
        assert len(ledger.events("start", job_id)) == runs, name
    for name, job_id in good.items():
        row = job_row(db, job_id)
        assert (row["attempts"], row["last_error"]) == (1, None), name
        assert [e.event for e in ledger.entries() if e.job_id == job_id] == ["start", "end"]

    # Still serving, and no traceback leaked into its log.
    assert worker.alive
    after = insert(db, NOOP, "{}")
    wait_until(lambda: status_of(db, after) == "done", 10, "a normal job after the poison")
    assert worker.alive
    log = worker.stderr()
    assert "Traceback" not in log, log
    for name, job_id in poison.items():
        assert f"job {job_id} " in log, name  # each failure is in the log, on one line


def test_oversized_arguments_are_refused_at_defer_and_nothing_is_written(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async def main() -> None:
        async with asyncq.App(dsn, max_args_bytes=1000) as small:

            @small.task(name="tests.faults.big")
            async def big(blob: str) -> None:
                pass

            # {"blob":"..."} is 11 bytes more than the blob.
            await big.defer("x" * 989)
            with pytest.raises(asyncq.PayloadTooLarge, match=r"1001 bytes .* cap is 1000"):
                await big.defer("x" * 990)
            with pytest.raises(asyncq.PayloadTooLarge, match=r"cap is 1000"):
                await big.defer("é" * 495)  # 990 bytes of UTF-8, in 495 characters
            with pytest.raises(asyncq.PayloadTooLarge):
                await big.defer_many([{"blob": "fits"}, {"blob": "x" * 5000}])
            with pytest.raises(asyncq.PayloadTooLarge):
                await big.options(delay=5, unique_key="k").defer("x" * 5000)

        async with asyncq.App(dsn) as default:

            @default.task(name="tests.faults.big")
            async def big_default(blob: str) -> None:
                pass

            with pytest.raises(asyncq.PayloadTooLarge, match=r"App\(max_args_bytes=\.\.\.\)"):
                await big_default.defer("x" * (1024 * 1024))
            assert issubclass(asyncq.PayloadTooLarge, TypeError)

    anyio.run(main)
    rows = db.execute("SELECT task_name, length(args::text) FROM asyncq_jobs").fetchall()
    assert rows == [("tests.faults.big", len('{"blob": ""}') + 989)]
