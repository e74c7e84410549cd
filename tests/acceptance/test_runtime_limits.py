"""Limits changed at runtime reach every worker process by the notification of the write:
a task limited to 1 in code, set to 3 by ``asyncq limits``, runs 3 at once across two
workers; ``--reset`` brings back 1. A group limit lowered from 4 to 1 while the groups'
jobs run, and a queue's rate lowered from 20/s to 2/s, hold from then on, read from the
jobs' own start and finish times; ``--reset`` brings back the code's. The workers read
the limits again on their own only every 60 s, and the tests wait at most 20 s for each
change: one seen came by the notification."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from tests.harness.jobs import insert_jobs
from tests.harness.limits_app import (
    APP,
    METERED,
    METERED_QUEUE,
    METERED_RATE,
    SINGLE,
    TENANT,
    TENANT_CAP,
)
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

Db = psycopg.Connection[Any]
SET_TO = 3
GROUPS = ["acme", "globex"]
# A job's start within this of another's finish is not an overlap: the write of one
# job's end and the claim of the next may take their times in either order.
CLOCKS = timedelta(milliseconds=5)


def running(db: Db) -> list[str]:
    """The workers of the running jobs of the task limited to 1 in code."""
    rows = db.execute(
        "SELECT locked_by FROM asyncq_jobs WHERE status = 'running' AND task_name = %s",
        (SINGLE,),
    ).fetchall()
    return [r[0] for r in rows]


def sample_until(db: Db, done: Callable[[list[list[str]]], bool], what: str) -> list[list[str]]:
    """Sample the running jobs until ``done(samples)``; the samples."""
    samples: list[list[str]] = []

    def sampled() -> bool:
        samples.append(running(db))
        return done(samples)

    wait_until(sampled, 20, what)
    return samples


def test_a_limit_set_at_runtime_holds_across_workers_and_reset_brings_back_the_code_one(
    db: Db, workers: Workers
) -> None:
    procs = [
        workers.start("--concurrency", "4", "--poll-interval", "0.2", app=APP, lease=30)
        for _ in range(2)
    ]
    ids = insert_jobs(db, SINGLE, [{"ms": 150}] * 1500)

    # The code's limit: one at a time, whichever worker runs it.
    before = sample_until(db, lambda s: len(s) >= 50, "50 samples")
    assert max(len(s) for s in before) == 1, before

    changed = workers.cli("limits", APP, SINGLE, "--concurrency", str(SET_TO))
    assert changed.returncode == 0, changed.stderr
    assert f"{SET_TO} (override)" in changed.stdout, changed.stdout
    for proc in procs:  # each has heard of it (its log says so), well within the minute ...
        proc.wait_log(f"{SINGLE} concurrency={SET_TO} (override)", 20)
    # ... and claims by it. Which worker runs them is the claims' race: one that writes its
    # jobs done and claims the next in one statement may keep all three.
    during = sample_until(db, lambda s: any(len(x) == SET_TO for x in s), f"{SET_TO} at once")
    during += sample_until(db, lambda s: len(s) >= 200, "200 samples more")
    assert max(len(s) for s in during) == SET_TO, during

    shown = workers.cli("limits", APP, "--json")
    rows = {r["name"]: r for r in map(json.loads, shown.stdout.splitlines())}
    assert rows[SINGLE]["concurrency"] == SET_TO
    assert rows[SINGLE]["concurrency_source"] == "override"

    reset = workers.cli("limits", APP, SINGLE, "--reset")
    assert reset.returncode == 0, reset.stderr
    assert "1 (code)" in reset.stdout, reset.stdout
    for proc in procs:  # each has read the table again (its log says so) ...
        proc.wait_log(f"{SINGLE} concurrency=1 (code)", 20)
    # ... so once the jobs claimed before are done, one at a time again.
    sample_until(db, lambda s: len(s[-1]) <= 1, "the jobs claimed before to end")
    after = sample_until(db, lambda s: len(s) >= 200, "200 samples more")
    assert max(len(s) for s in after) == 1, after

    assert set(workers.stop_all().values()) == {0}
    assert not workers.tracebacks(), workers.tracebacks()
    left = db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND status = 'queued'", (ids,)
    ).fetchone()
    assert left is not None and left[0] > 0  # the jobs outlasted the test: it sampled load


def test_the_command_refuses_bad_limits_and_keeps_an_unknown_name(db: Db, workers: Workers) -> None:
    zero = workers.cli("limits", APP, SINGLE, "--concurrency", "0")
    assert zero.returncode == 1, zero
    assert "concurrency must be a whole number from 1" in zero.stderr
    rate = workers.cli("limits", APP, SINGLE, "--rate", "ten/s")
    assert rate.returncode == 1, rate
    assert 'rate_limit must be "N/s", "N/m" or "N/h"' in rate.stderr
    both = workers.cli("limits", APP, SINGLE, "--concurrency", "2", "--reset")
    assert both.returncode == 2, both
    assert db.execute("SELECT count(*) FROM asyncq_limits").fetchone() == (0,)

    unknown = workers.cli("limits", APP, "billing.charge", "--concurrency", "4")
    assert unknown.returncode == 0, unknown.stderr
    assert "no task or queue of this App is named 'billing.charge'" in unknown.stderr
    assert "billing.charge (unknown)" in unknown.stdout

    listing = workers.cli("limits", APP)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == [
        "name",
        "kind",
        "queue",
        "concurrency",
        "rate",
        "group",
        "concurrency",
    ]
    assert any(SINGLE in line and "1 (code)" in line for line in lines), listing.stdout
    assert any("billing.charge (unknown)" in line and "4 (override)" in line for line in lines)


def start_two_workers(workers: Workers) -> list[Any]:
    return [
        workers.start("--concurrency", "8", "--poll-interval", "0.2", app=APP, lease=30)
        for _ in range(2)
    ]


def now(db: Db) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def most_at_once(db: Db, since: datetime) -> dict[str, int]:
    """For each group of `TENANT`, the most of its jobs running at once at the start of
    one of its jobs started after ``since``, from the jobs' start and finish times."""
    rows = db.execute(
        "SELECT a.group_key, max((SELECT count(*) FROM asyncq_jobs b"
        "  WHERE b.task_name = a.task_name AND b.group_key = a.group_key"
        "    AND b.started_at <= a.started_at"
        "    AND coalesce(b.finished_at, 'infinity') > a.started_at + %s))"
        " FROM asyncq_jobs a WHERE a.task_name = %s AND a.started_at > %s GROUP BY 1",
        (CLOCKS, TENANT, since),
    ).fetchall()
    return dict(rows)


def ended_since(db: Db, since: datetime) -> dict[str, int]:
    """For each group of `TENANT`, its jobs started after ``since`` and done."""
    rows = db.execute(
        "SELECT group_key, count(*) FROM asyncq_jobs"
        " WHERE task_name = %s AND started_at > %s AND status = 'done' GROUP BY 1",
        (TENANT, since),
    ).fetchall()
    return dict(rows)


def set_limits(workers: Workers, procs: list[Any], *args: str, shown: str, logged: str) -> None:
    """Run ``asyncq limits APP *args``, and wait until each worker logs ``logged``."""
    done = workers.cli("limits", APP, *args)
    assert done.returncode == 0, done.stderr
    assert shown in done.stdout, done.stdout
    for proc in procs:
        proc.wait_log(logged, 20)


def test_a_group_limit_lowered_while_its_jobs_run_holds_at_once_and_reset_brings_back_the_code_one(
    db: Db, workers: Workers
) -> None:
    procs = start_two_workers(workers)
    began = now(db)
    ids = [
        job_id
        for (job_id,) in db.execute(
            "INSERT INTO asyncq_jobs (task_name, args, group_key)"
            " SELECT %s, '{\"ms\": 150}', g FROM generate_series(1, 400), unnest(%s::text[]) AS g"
            " ORDER BY generate_series, g RETURNING id",
            (TENANT, GROUPS),
        ).fetchall()
    ]

    # The code's limit: each group reaches 4 at once across the two workers.
    wait_until(lambda: ended_since(db, began).get("acme", 0) >= 16, 30, "16 jobs of acme")
    before = most_at_once(db, began)
    assert before == dict.fromkeys(GROUPS, TENANT_CAP), before

    set_limits(
        workers,
        procs,
        TENANT,
        "--group-concurrency",
        "1",
        shown="1 (override)",
        logged=f"{TENANT} group_concurrency=1 (override)",
    )
    # Every claim that starts from now on has the new limit.
    lowered = now(db)
    wait_until(
        lambda: min(ended_since(db, lowered).get(g, 0) for g in GROUPS) >= 10,
        30,
        "10 jobs of each group after the change",
    )
    during = most_at_once(db, lowered)
    assert during == dict.fromkeys(GROUPS, 1), during

    set_limits(
        workers,
        procs,
        TENANT,
        "--reset",
        shown=f"{TENANT_CAP} (code)",
        logged=f"{TENANT} group_concurrency={TENANT_CAP} (code)",
    )
    reset = now(db)
    wait_until(
        lambda: most_at_once(db, reset) == dict.fromkeys(GROUPS, TENANT_CAP),
        20,
        f"{TENANT_CAP} jobs of each group at once again",
    )

    assert set(workers.stop_all().values()) == {0}
    assert not workers.tracebacks(), workers.tracebacks()
    assert most_at_once(db, reset) == dict.fromkeys(GROUPS, TENANT_CAP)
    left = db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND status = 'queued'", (ids,)
    ).fetchone()
    assert left is not None and left[0] > 0  # the jobs outlasted the test


def starts_since(db: Db, since: datetime) -> list[datetime]:
    return [
        at
        for (at,) in db.execute(
            "SELECT started_at FROM asyncq_jobs WHERE task_name = %s AND started_at > %s"
            " ORDER BY started_at",
            (METERED, since),
        ).fetchall()
    ]


def fullest_second(starts: list[datetime]) -> int:
    """The most starts in a window of one second (the fullest starts at some start)."""
    second = timedelta(seconds=1)
    return max((sum(1 for t in starts if s <= t < s + second) for s in starts), default=0)


def test_a_queue_rate_lowered_at_runtime_spaces_the_starts_out_and_reset_brings_back_the_code_one(
    db: Db, workers: Workers
) -> None:
    procs = start_two_workers(workers)
    began = now(db)
    insert_jobs(db, METERED, [{"n": n} for n in range(3000)], queue=METERED_QUEUE)

    # The code's rate: 20 starts in a second.
    wait_until(lambda: len(starts_since(db, began)) >= 3 * METERED_RATE, 30, "60 starts")
    before = starts_since(db, began)
    assert fullest_second(before) == METERED_RATE, before

    set_limits(
        workers,
        procs,
        METERED_QUEUE,
        "--rate",
        "2/s",
        shown="2/s (queue override)",
        logged=f"{METERED} rate_limit=2/s (queue override)",
    )
    lowered = now(db)
    wait_until(lambda: len(starts_since(db, lowered)) >= 8, 20, "8 starts after the change")
    during = starts_since(db, lowered)
    assert fullest_second(during) <= 2, during
    # Spaced out: 8 starts take 3 s (two a second, a claim of two at a time), where the
    # code's 20/s started them within half a second.
    assert during[7] - during[0] >= timedelta(seconds=2.5), during

    set_limits(
        workers,
        procs,
        METERED_QUEUE,
        "--reset",
        shown=f"{METERED_RATE}/s (code)",
        logged=f"{METERED} rate_limit={METERED_RATE}/s (code)",
    )
    reset = now(db)
    wait_until(
        lambda: fullest_second(starts_since(db, reset)) == METERED_RATE,
        20,
        f"{METERED_RATE} starts in a second again",
    )

    assert set(workers.stop_all().values()) == {0}
    assert not workers.tracebacks(), workers.tracebacks()
    assert fullest_second(starts_since(db, reset)) == METERED_RATE
