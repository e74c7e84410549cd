"""Limits hold across worker processes: a sampler connection polls the running jobs
many times a second while several workers run limited tasks, and finds the limit never
exceeded, and reached (so that the test says something). Rate limits are read from the
claim times (``locked_at``, which a job of no heartbeat keeps once done)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

import psycopg

from tests.harness.jobs import insert_jobs
from tests.harness.limits_app import (
    APP,
    CAPPED,
    CAPPED_AT,
    FREE,
    GROUP_CAP,
    GROUPED,
    RATE,
    RATED,
)
from tests.harness.processes import Workers

WORKERS = 4
Db = psycopg.Connection[Any]


def start_workers(workers: Workers) -> None:
    # Short polls: claims of several workers often meet, as they must for a race to show.
    procs = [
        workers.start(
            "--concurrency", "8", "--poll-interval", "0.05", app=APP, lease=30, ready=False
        )
        for _ in range(WORKERS)
    ]
    for proc in procs:
        proc.wait_ready()


def sample_until_done(db: Db, task: str, ids: list[int], timeout: float = 90) -> list[Counter[Any]]:
    """Poll the running jobs of ``task`` (by group) until every job of ``ids`` is done;
    one Counter of group -> running jobs per sample."""
    samples: list[Counter[Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        rows = db.execute(
            "SELECT group_key, count(*) FROM asyncq_jobs"
            " WHERE status = 'running' AND task_name = %s GROUP BY group_key",
            (task,),
        ).fetchall()
        samples.append(Counter(dict(rows)))
        (left,) = db.execute(
            "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND status <> 'done'", (ids,)
        ).fetchone()
        if left == 0:
            return samples
        assert time.monotonic() < deadline, f"{left} jobs not done after {timeout:.0f}s"
        time.sleep(0.002)


def finish(workers: Workers) -> None:
    assert set(workers.stop_all().values()) == {0}
    assert not workers.tracebacks(), workers.tracebacks()


def test_concurrency_is_never_exceeded_and_does_not_hold_up_other_tasks(
    db: Db, workers: Workers
) -> None:
    start_workers(workers)
    # The limited task's jobs are ahead of the others in the queue.
    capped = insert_jobs(db, CAPPED, [{"ms": 60}] * 40)
    free = insert_jobs(db, FREE, [{"ms": 10}] * 200)

    samples = sample_until_done(db, CAPPED, capped + free)
    finish(workers)

    running = [sum(s.values()) for s in samples]
    assert max(running) <= CAPPED_AT, Counter(running)
    assert max(running) == CAPPED_AT, Counter(running)
    assert len(samples) > 100  # sampled many times while the jobs ran

    # The saturated task held up no other job: the others were all done long before it.
    (free_end,) = db.execute(
        "SELECT max(finished_at) FROM asyncq_jobs WHERE id = ANY(%s)", (free,)
    ).fetchone()
    (capped_end,) = db.execute(
        "SELECT max(finished_at) FROM asyncq_jobs WHERE id = ANY(%s)", (capped,)
    ).fetchone()
    assert free_end < capped_end


def test_group_concurrency_is_never_exceeded_and_groups_run_in_id_order(
    db: Db, workers: Workers
) -> None:
    start_workers(workers)
    groups = ["acme", "globex", "initech", "umbrella"]
    # One statement, interleaved as customers' jobs come: its notification wakes every
    # worker at once, so their first claims meet.
    ids = [
        job_id
        for (job_id,) in db.execute(
            "INSERT INTO asyncq_jobs (task_name, args, group_key)"
            " SELECT %s, '{\"ms\": 60}', g FROM generate_series(1, 20), unnest(%s::text[]) AS g"
            " ORDER BY generate_series, g RETURNING id",
            (GROUPED, groups),
        ).fetchall()
    ]
    # Other work keeps the workers claiming, often at the same moment.
    free = insert_jobs(db, FREE, [{"ms": 5}] * 300)

    samples = sample_until_done(db, GROUPED, ids + free)
    finish(workers)

    per_group = {g: max(s[g] for s in samples) for g in groups}
    assert all(n <= GROUP_CAP for n in per_group.values()), per_group
    assert max(per_group.values()) == GROUP_CAP, per_group
    # Groups run side by side: more than one group's cap at once.
    assert max(sum(s.values()) for s in samples) > GROUP_CAP

    claims: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for group, locked_at, job_id in db.execute(
        "SELECT group_key, locked_at, id FROM asyncq_jobs WHERE id = ANY(%s)", (ids,)
    ):
        claims[group].append((locked_at, job_id))
    for group, claimed in claims.items():
        in_claim_order = [job_id for _, job_id in sorted(claimed)]
        assert in_claim_order == sorted(in_claim_order), group


def test_rate_limit_holds_in_every_window(db: Db, workers: Workers) -> None:
    start_workers(workers)
    rated = insert_jobs(db, RATED, [{"n": n} for n in range(3 * RATE + 5)])
    free = insert_jobs(db, FREE, [{"ms": 0}] * 100)

    sample_until_done(db, RATED, rated + free)
    finish(workers)

    starts = sorted(
        at
        for (at,) in db.execute(
            "SELECT locked_at FROM asyncq_jobs WHERE id = ANY(%s)", (rated,)
        ).fetchall()
    )
    second = timedelta(seconds=1)
    # The fullest window of one second starts at some start.
    fullest = max(sum(1 for t in starts if s <= t < s + second) for s in starts)
    assert fullest <= RATE, fullest
    assert fullest == RATE


def test_a_limited_worker_claims_again_as_its_outcomes_are_written_not_at_the_poll(
    db: Db, workers: Workers
) -> None:
    # A limit (a task's, or a group's) that holds back ready jobs: the jobs running count
    # against it until their outcomes are written, so the worker looks again after each
    # write. With only the poll (30 s here) to look again, these 0.1 s jobs, 2 or 3 at a
    # time, would take minutes; counted by the jobs done, not timed.
    workers.start("--concurrency", "8", "--poll-interval", "30", app=APP, lease=30)
    grouped = insert_jobs(db, GROUPED, [{"ms": 100}] * 12, group_key="acme")
    capped = insert_jobs(db, CAPPED, [{"ms": 100}] * 12)

    samples = sample_until_done(db, GROUPED, grouped + capped, timeout=20)
    finish(workers)
    assert max(s["acme"] for s in samples) == GROUP_CAP
