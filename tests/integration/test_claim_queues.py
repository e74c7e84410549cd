"""The claim of several queues (migration 0013) reads each queue's ready jobs through
that queue's index and takes the first of them all in the claim's order: higher priority
first, then run_at, then id, across the queues; a paused queue is skipped; claims racing
each other never take the same job."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

CLAIM = "SELECT job_id, job_queue FROM asyncq_claim('w', %s, '30 s', %s::text[])"


def jobs(db: psycopg.Connection[Any], queue: str, priority: int, count: int) -> list[int]:
    rows = db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue, priority)"
        " SELECT 't', %s, %s FROM generate_series(1, %s) RETURNING id",
        [queue, priority, count],
    ).fetchall()
    return [row[0] for row in rows]


def test_several_queues_are_claimed_in_the_claims_order(db: psycopg.Connection[Any]) -> None:
    low = jobs(db, "a", 0, 3)
    high = jobs(db, "b", 5, 2)
    jobs(db, "c", 9, 2)  # not asked for
    claimed = db.execute(CLAIM, [3, ["a", "b"]]).fetchall()
    assert claimed == [(high[0], "b"), (high[1], "b"), (low[0], "a")]


def test_a_paused_queue_of_several_is_skipped(db: psycopg.Connection[Any]) -> None:
    low = jobs(db, "a", 0, 2)
    jobs(db, "b", 5, 2)
    db.execute("INSERT INTO asyncq_queues (name, paused_at) VALUES ('b', now())")
    claimed = db.execute(CLAIM, [10, ["a", "b"]]).fetchall()
    assert claimed == [(low[0], "a"), (low[1], "a")]


def test_a_queue_named_twice_is_claimed_once(db: psycopg.Connection[Any]) -> None:
    ids = jobs(db, "a", 0, 3)
    claimed = db.execute(CLAIM, [10, ["a", "a", "b"]]).fetchall()
    assert sorted(row[0] for row in claimed) == ids


@pytest.mark.parametrize("queues", [["a", "b"], ["a"], None])
def test_racing_claims_never_take_the_same_job(
    db: psycopg.Connection[Any], dsn: str, queues: list[str] | None
) -> None:
    in_a, in_b = set(jobs(db, "a", 0, 300)), set(jobs(db, "b", 1, 300))
    expected = in_a if queues == ["a"] else in_a | in_b
    claimers = 8
    start = threading.Barrier(claimers)
    taken: list[list[int]] = [[] for _ in range(claimers)]

    def claim(into: list[int]) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            start.wait(timeout=30)
            while True:
                rows = conn.execute(CLAIM, [7, queues]).fetchall()
                if not rows:
                    # Empty: the rest is claimed, or held by a claim still running.
                    left = conn.execute(
                        "SELECT count(*) FROM asyncq_jobs WHERE status = 'queued'"
                        " AND (%s::text[] IS NULL OR queue = ANY(%s::text[]))",
                        [queues, queues],
                    ).fetchone()
                    if left is not None and left[0] == 0:
                        return
                into.extend(row[0] for row in rows)

    threads = [threading.Thread(target=claim, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    every = [job for into in taken for job in into]
    assert len(every) == len(set(every)), "a job was claimed twice"
    assert set(every) == expected
