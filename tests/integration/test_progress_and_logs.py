"""What a running task reports (``ctx.progress``) and logs, kept with its attempt: written
while it runs (coalesced, fenced) and with its outcome; its log records bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq import admin, pools
from asyncq.worker import checkpoints, logcapture
from tests.harness.waiting import wait_until

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)
log = logging.getLogger("shop.import")


def row(db: psycopg.Connection[Any], job_id: int, *columns: str) -> tuple[Any, ...]:
    found = db.execute(
        f"SELECT {', '.join(columns)} FROM asyncq_jobs WHERE id = %s",  # type: ignore[arg-type]
        (job_id,),
    ).fetchone()
    assert found is not None
    return found


async def detail(app: asyncq.App, job_id: int) -> admin.JobDetail:
    async with pools.connection(app.pool) as conn:
        found = await admin.job(conn, app.store, job_id)
    assert found is not None
    return found


@pytest.fixture
def progress_writes(db: psycopg.Connection[Any]) -> Iterator[Any]:
    """Counts the writes of asyncq_jobs.progress (a trigger of this test's own)."""
    db.execute("CREATE TABLE progress_writes (job_id bigint, progress jsonb)")
    db.execute(
        "CREATE FUNCTION count_progress() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN INSERT INTO progress_writes VALUES (NEW.id, NEW.progress); RETURN NEW; END $$"
    )
    db.execute(
        "CREATE TRIGGER count_progress AFTER UPDATE OF progress ON asyncq_jobs"
        " FOR EACH ROW WHEN (OLD.progress IS DISTINCT FROM NEW.progress)"
        " EXECUTE FUNCTION count_progress()"
    )
    yield lambda job_id: db.execute(
        "SELECT progress FROM progress_writes WHERE job_id = %s", (job_id,)
    ).fetchall()
    db.execute("DROP TRIGGER count_progress ON asyncq_jobs")
    db.execute("DROP FUNCTION count_progress()")
    db.execute("DROP TABLE progress_writes")


async def test_progress_is_written_while_the_task_runs_and_kept_with_its_end(
    app: asyncq.App, db: Any, drain: Any, progress_writes: Any
) -> None:
    seen = asyncio.Event()
    reporting = [0.0, 0.0]  # when the reports began and ended (the loop's clock)

    @app.task(name="progress.importer")
    async def importer(rows: int) -> None:
        ctx = asyncq.current_job()
        ctx.progress(0.25, "reading the file")
        await seen.wait()  # until the test has seen it on the row, while the job runs
        loop = asyncio.get_running_loop()
        reporting[0] = loop.time()
        for n in range(rows):
            ctx.progress(n + 1, "imported")
            await asyncio.sleep(0.001)
        reporting[1] = loop.time()

    job_id = await importer.defer(rows=300)

    async def look() -> None:
        def written() -> bool:
            progress, status = row(db, job_id, "progress", "status")
            return status == "running" and progress is not None

        await asyncio.to_thread(wait_until, written, 10, "the first progress on the row")
        progress = row(db, job_id, "progress")[0]
        assert (progress["fraction"], progress["message"], progress["attempt"]) == (
            0.25,
            "reading the file",
            1,
        )
        seen.set()

    async with asyncio.TaskGroup() as group:
        group.create_task(look())
        group.create_task(drain())

    progress = row(db, job_id, "progress")[0]
    assert (progress["count"], progress["message"]) == (300, "imported")
    # Coalesced: 300 reports, one a millisecond or less often, written at most once per
    # PROGRESS_EVERY (however long the reports took), and the last with the outcome.
    writes = progress_writes(job_id)
    most = (reporting[1] - reporting[0]) / checkpoints.PROGRESS_EVERY + 3
    assert 2 <= len(writes) <= most < 300, (len(writes), most)
    assert writes[-1][0]["count"] == 300
    found = await detail(app, job_id)
    assert found.progress is not None and found.progress.count == 300


async def test_progress_from_a_plain_def_task_and_from_a_failed_attempt(
    app: asyncq.App, db: Any, settle: Any
) -> None:
    @app.task(name="progress.threaded", retry=AT_ONCE, max_attempts=2)
    def threaded() -> None:
        ctx = asyncq.current_job()
        ctx.progress(ctx.attempt / 2, f"attempt {ctx.attempt}")
        if ctx.attempt == 1:
            raise RuntimeError("first time unlucky")

    job_id = await threaded.defer()
    assert await settle([job_id]) == [(job_id, "done", 2)]
    failed, done = (await detail(app, job_id)).attempts
    assert failed.outcome == "retried" and failed.progress is not None
    assert (failed.progress.fraction, failed.progress.message) == (0.5, "attempt 1")
    assert done.progress is not None and done.progress.fraction == 1.0
    assert row(db, job_id, "progress")[0]["message"] == "attempt 2"


def test_a_report_of_progress_is_checked() -> None:
    from asyncq.job import progress_json

    for bad in (True, -1, 1.5, -0.1, float("nan"), "half", None):
        with pytest.raises((TypeError, ValueError)):
            progress_json(bad, None, 1)
    with pytest.raises(TypeError):
        progress_json(0.5, 7, 1)
    long = progress_json(3, "x" * 5000 + "\x00", 2)
    assert '"count":3' in long and '"attempt":2' in long and len(long) < 700


async def test_what_a_task_logs_is_kept_with_its_attempt(
    app: asyncq.App, db: Any, settle: Any, caplog: Any
) -> None:
    caplog.set_level(logging.INFO)

    @app.task(name="logs.chatty", retry=AT_ONCE, max_attempts=2)
    async def chatty() -> None:
        attempt = asyncq.current_job().attempt
        log.debug("not at the capture level")
        log.info("attempt %d: reading", attempt)
        if attempt == 1:
            try:
                raise KeyError("row 7")
            except KeyError:
                log.exception("a bad row")
            raise RuntimeError("giving up on this attempt")
        log.warning("attempt %d: done", attempt)

    @app.task(name="logs.quiet")
    async def quiet() -> None:
        pass

    job_id = await chatty.defer()
    quiet_id = await quiet.defer()
    log.info("outside any attempt")  # kept by no attempt
    assert await settle([job_id, quiet_id]) == [(job_id, "done", 2), (quiet_id, "done", 1)]

    failed, done = (await detail(app, job_id)).attempts
    assert failed.logs is not None and done.logs is not None
    assert [(r.level, r.logger, r.message) for r in failed.logs.records] == [
        ("INFO", "shop.import", "attempt 1: reading"),
        ("ERROR", "shop.import", "a bad row"),
    ]
    exception = failed.logs.records[1].exception
    assert exception is not None and "KeyError: 'row 7'" in exception
    assert [r.message for r in done.logs.records] == ["attempt 2: reading", "attempt 2: done"]
    assert row(db, job_id, "logs")[0]["records"][1]["message"] == "attempt 2: done"
    # The application's own handlers saw every record, as before.
    messages = [r.getMessage() for r in caplog.records if r.name == "shop.import"]
    assert messages.count("attempt 1: reading") == 1 and "outside any attempt" in messages
    # A job that logs nothing keeps nothing.
    assert row(db, quiet_id, "logs", "history") == (None, None)


async def test_the_records_kept_are_bounded(
    app: asyncq.App, db: Any, drain: Any, caplog: Any
) -> None:
    caplog.set_level(logging.INFO)

    @app.task(name="logs.flood")
    async def flood(lines: int, size: int) -> None:
        for n in range(lines):
            log.info("line %d %s", n, "x" * size)

    many = await flood.defer(lines=200, size=0)
    long = await flood.defer(lines=30, size=5000)
    await drain()

    [attempt] = (await detail(app, many)).attempts
    assert attempt.logs is not None
    kept = [r.message.split()[1] for r in attempt.logs.records]
    assert len(kept) == logcapture.MAX_RECORDS and attempt.logs.dropped == 150
    assert kept == [str(n) for n in (*range(10), *range(160, 200))]  # the first 10, the last 40

    [attempt] = (await detail(app, long)).attempts
    assert attempt.logs is not None
    records = attempt.logs.records
    assert all(len(r.message) <= logcapture.MAX_MESSAGE for r in records)
    assert records[-1].message.startswith("line 29 ")  # the latest are kept
    assert sum(len(r.message) for r in records) <= logcapture.MAX_BYTES
    assert attempt.logs.dropped == 30 - len(records) > 0


async def test_the_capture_level_and_off(app: asyncq.App, db: Any, drain: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO)

    @app.task(name="logs.levels")
    async def levels() -> None:
        log.info("info")
        log.warning("warning")

    warned = await levels.defer()
    await drain(log_capture="WARNING")
    [attempt] = (await detail(app, warned)).attempts
    assert attempt.logs is not None
    assert [r.message for r in attempt.logs.records] == ["warning"]

    silent = await levels.defer()
    await drain(log_capture="off")
    assert row(db, silent, "logs")[0] is None
    assert logging.getLogRecordFactory() is logging.LogRecord  # put back as it was
