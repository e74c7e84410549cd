"""Limits changed at runtime reach every worker process by the notification of the write:
a task limited to 1 in code, set to 3 by ``asyncq limits``, runs 3 at once across two
workers; ``--reset`` brings back 1. The workers read the limits again on their own only
every 60 s, and the test waits at most 20 s for each change: one seen came by the
notification."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg

from tests.harness.jobs import insert_jobs
from tests.harness.limits_app import APP, SINGLE
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

Db = psycopg.Connection[Any]
SET_TO = 3


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
