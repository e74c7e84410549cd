"""The claim that writes done outcomes: fenced as mark_done is, in the claim's statement,
and what it could not write (refused, or its answer lost) is written by the completer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.job import Job

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)


async def test_the_claim_writes_done_only_what_this_claim_still_owns_and_claims_in_order(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="cwd.noop")
    async def noop() -> None:
        pass

    store, worker = app.store, "host:1:cwd"
    ids = [await noop.defer() for _ in range(3)]
    urgent = await noop.options(priority=5).defer()
    async with app.pool.connection() as conn:
        first, second = await store.claim(conn, worker=worker, limit=2, queues=None, lease=LEASE)
        assert [first.id, second.id] == [urgent, ids[0]]
        # The second's lease is lost: this very worker (frozen past its lease, say) claimed
        # the job again, and holds it by a later claim now.
        db.execute("UPDATE asyncq_jobs SET claims = claims + 1 WHERE id = %s", (second.id,))
        claimed, written = await store.claim_writing_done(
            conn, worker=worker, limit=10, queues=None, lease=LEASE, done=[first, second]
        )
        assert written == 1
        assert [job.id for job in claimed] == ids[1:]
        assert all(isinstance(job, Job) and job.claim == 1 for job in claimed)
        nothing, written = await store.claim_writing_done(
            conn, worker=worker, limit=10, queues=["elsewhere"], lease=LEASE, done=claimed
        )
        assert (nothing, written) == ([], 2)
    rows = db.execute("SELECT id, status::text, locked_by FROM asyncq_jobs ORDER BY id").fetchall()
    assert rows == [
        (ids[0], "running", worker),
        (ids[1], "done", worker),
        (ids[2], "done", worker),
        (urgent, "done", worker),
    ]


async def test_done_outcomes_of_a_claim_whose_answer_was_lost_are_written_and_reported_done(
    app: asyncq.App, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    @app.task(name="cwd.many")
    async def many() -> None:
        pass

    store = app.store
    claim_writing_done = store.claim_writing_done
    calls: list[int] = []

    async def answer_lost(conn: Any, **kwargs: Any) -> Any:
        calls.append(len(kwargs["done"]))
        result = await claim_writing_done(conn, **kwargs)
        if len(calls) == 1:  # it committed; its answer never came back
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(store, "claim_writing_done", answer_lost)
    await many.defer_many([{}] * 300)
    stats = await app.run_worker(
        drain=True, handle_signals=False, concurrency=10, batch_size=10, prefetch=0
    )
    assert calls[0] > 0, "the first claim that wrote done outcomes was not the one cut off"
    # The outcomes that claim wrote are found written, and counted done; the ten jobs it
    # claimed are left to their lease, as any claim whose answer was lost leaves them.
    assert (stats.claimed, stats.done, stats.lost) == (290, 290, 0)
    statuses = db.execute(
        "SELECT status::text, count(*) FROM asyncq_jobs GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert statuses == [("done", 290), ("running", 10)]
