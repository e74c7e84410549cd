"""Whatever ends an attempt that a cancel has marked ends its job cancelled: a failure, a
snooze, a hand-back, the reaper; never queued again. The cancel API's answers."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import asyncq

pytestmark = pytest.mark.anyio


async def mark_own_job(dsn: str) -> None:
    """What a cancel from another process does, less the notification: the worker learns of
    it only from the row, when the attempt ends."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE asyncq_jobs SET abort_requested_at = now() WHERE id = %s",
            (asyncq.current_job().id,),
        )


def status(db: Any, job_id: int) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT status::text, attempts, finished_at IS NOT NULL FROM asyncq_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(
    "ending",
    [RuntimeError("boom"), asyncq.Retry(after=0), asyncq.Snooze(0)],
    ids=["failure", "retry", "snooze"],
)
async def test_an_attempt_ending_after_a_cancel_ends_the_job_cancelled(
    app: asyncq.App, dsn: str, db: Any, drain: Any, ending: Exception
) -> None:
    @app.task(name="cancel.ends", max_attempts=5)
    async def ends() -> None:
        await mark_own_job(dsn)
        raise ending

    job_id = await ends.defer()
    await drain()
    assert status(db, job_id)[0] == "cancelled"
    assert status(db, job_id)[2]


async def test_the_reaper_ends_a_marked_job_cancelled(app: asyncq.App, db: Any, drain: Any) -> None:
    @app.task(name="cancel.reaped")
    async def reaped() -> None:
        pass

    job_id = await reaped.defer()
    # A worker died holding it after the cancel marked it: its lease runs out.
    db.execute(
        "UPDATE asyncq_jobs SET status = 'running', attempts = 1, claims = 1, locked_by = 'gone',"
        " locked_at = now() - interval '1 minute', expires_at = now() - interval '1 second',"
        " abort_requested_at = now() WHERE id = %s",
        (job_id,),
    )
    store = app.store
    async with app.pool.connection() as conn:
        assert await store.reap_expired(conn, limit=10) == {job_id: "cancelled"}
    assert status(db, job_id) == ("cancelled", 1, True)


async def test_cancel_answers_for_each_id(app: asyncq.App, db: Any, drain: Any) -> None:
    @app.task(name="cancel.answers")
    async def answers() -> None:
        pass

    done_id = await answers.defer()
    await drain()
    queued_id = await answers.defer()
    assert await app.cancel(queued_id, done_id, 10**12, queued_id) == {
        queued_id: "cancelled",
        done_id: "done",
        10**12: "not found",
    }
    assert await app.cancel(queued_id) == {queued_id: "cancelled"}
    assert await app.cancel() == {}
    with pytest.raises(TypeError):
        await app.cancel("12")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await app.cancel(0)
    # A cancelled job can be requeued, and then runs.
    assert (await app.requeue([queued_id])).requeued == [queued_id]
    await drain()
    assert status(db, queued_id)[0] == "done"


async def test_pause_and_resume_answer_and_refuse_bad_names(
    app: asyncq.App, db: Any, drain: Any
) -> None:
    @app.task(name="pause.api", queue="paused")
    async def held() -> None:
        pass

    assert await app.pause("paused") is True
    assert await app.pause("paused") is False
    job_id = await held.defer()  # defers still write
    await drain()
    assert status(db, job_id)[0] == "queued"
    assert await app.resume("paused") is True
    assert await app.resume("paused") is False
    await drain()
    assert status(db, job_id)[0] == "done"
    with pytest.raises(asyncq.InvalidName):
        await app.pause("")
