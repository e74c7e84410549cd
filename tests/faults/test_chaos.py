"""Chaos: workers killed with SIGKILL again and again while jobs stream in.

Three workers share a stream of short jobs; every 1.5 s one of them, at random, is
killed with ``kill -9`` and a new one started at once, for 30 s; then the rest drains.
No job may be lost, none may complete twice, and every job that ran more than once
did so because the process that held it was killed. The ledger files (one per
process, written by the tasks) and the status history (written by a trigger) are the
evidence; the jobs table alone could hide a doubled run.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import (
    Db,
    Deferrer,
    Sampler,
    claims,
    create_database,
    done_touched,
    explain,
    fault_workers,
    jobs,
    not_done,
    record_figures,
    summary,
    transitions,
)
from tests.harness.ledger import Entry
from tests.harness.processes import WorkerProcess
from tests.harness.waiting import wait_until

WORKERS = 3
CONCURRENCY = 10
LEASE = 2.0
REAP_INTERVAL = 2.0  # WorkerSettings.reap_interval
CHAOS_SECONDS = 30.0
KILL_EVERY = 1.5
PER_TICK, TICK = 12, 0.1  # 120 jobs a second
MAX_ATTEMPTS = 10  # a job may be caught by several kills; each counts an attempt
IN_FLIGHT = 5.0  # how long after a kill its last statement may still commit


def job_ms(rng: random.Random) -> int:
    """Half the jobs return at once, half sleep 50-500 ms."""
    return 0 if rng.random() < 0.5 else rng.randint(50, 500)


@pytest.mark.timeout(240)
def test_kill_9_loses_nothing_and_doubles_nothing(
    server: ControlledPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = create_database(server, "chaos", history=True)
    workers = fault_workers(dsn, tmp_path)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # Batches of half the concurrency: each worker runs two claim loops (the server-fault
    # tests run workers with one).
    options = ("--concurrency", str(CONCURRENCY), "--batch-size", str(CONCURRENCY // 2))
    try:
        with Sampler(server.dsn(), "chaos") as sampler, Db(dsn) as db:
            running: list[WorkerProcess] = [
                workers.start(*options, lease=LEASE, ready=False) for _ in range(WORKERS)
            ]
            for proc in running:
                proc.wait_ready(30)
            with Deferrer(
                dsn, per_tick=PER_TICK, tick=TICK, ms=job_ms, max_attempts=MAX_ATTEMPTS, seed=seed
            ) as deferrer:
                began = time.monotonic()
                while time.monotonic() - began < CHAOS_SECONDS:
                    time.sleep(KILL_EVERY)
                    slot = rng.randrange(WORKERS)
                    workers.kill9(running[slot])
                    running[slot] = workers.start(*options, lease=LEASE, ready=False)
            chaos_seconds = time.monotonic() - began
            for proc in running:
                proc.wait_ready(30)
            ids = list(deferrer.committed.values())
            drain_began = time.monotonic()
            wait_until(lambda: not_done(db, ids) == 0, 90, "every committed job to be done")
            drain_seconds = time.monotonic() - drain_began
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            changes = transitions(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    assert deferrer.committed, "nothing was deferred"
    assert not deferrer.uncertain, "an INSERT failed on a server nobody touched"
    lost = [t for t, i in deferrer.committed.items() if rows.get(i, {}).get("status") != "done"]
    assert not lost, f"{len(lost)} committed jobs not done, e.g. {lost[:10]}"
    assert len(rows) == len(deferrer.committed), "jobs nobody deferred"
    assert set(exits.values()) == {0}, exits
    assert not touched, f"done rows updated: {touched[:5]}"
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    sampler.check()
    assert len(workers.killed) >= CHAOS_SECONDS / KILL_EVERY - 2

    killed = workers.killed
    problems: list[str] = []
    troubled: list[int] = []
    recovery: list[float] = []
    starts_more_than_once = ran_to_end_more_than_once = claimed_after_kill = 0
    for job_id, row in rows.items():
        job_claims = history[job_id]
        events = ledger.get(job_id, [])
        found = check_job(job_id, row, job_claims, events, killed)
        if found:
            problems += found
            troubled.append(job_id)
        starts = [e for e in events if e.event == "start"]
        ends = [e for e in events if e.event == "end"]
        starts_more_than_once += len(starts) > 1
        ran_to_end_more_than_once += len(ends) > 1
        # Every attempt before the last was held by a killed worker: time from its kill to
        # the job's next start elsewhere.
        for claim in job_claims[:-1]:
            claimed_after_kill += claim.pid in killed and claim.at > killed[claim.pid]
            if claim.pid in killed:
                later = [s for s in starts if s.attempt > claim.attempt and s.pid != claim.pid]
                if later:
                    recovery.append(later[0].at - killed[claim.pid])
    assert not problems, (
        f"{len(problems)} problems:\n"
        + "\n".join(problems[:30])
        + "\n"
        + explain(workers, troubled[:5], changes, ledger)
    )
    assert recovery, "no kill caught a job: the chaos tested nothing"
    # A dead worker's job comes back once its lease has expired and a reaper pass has
    # seen it: about lease + reap interval after the kill, never much more.
    assert max(recovery) < LEASE + REAP_INTERVAL + 6, summary(recovery)

    attempts = Counter(row["attempts"] for row in rows.values())
    figures: dict[str, Any] = {
        "seed": seed,
        "workers": WORKERS,
        "concurrency": CONCURRENCY,
        "lease_s": LEASE,
        "chaos_s": round(chaos_seconds, 1),
        "kills": len(killed),
        "jobs_deferred": len(deferrer.committed),
        "jobs_done": sum(r["status"] == "done" for r in rows.values()),
        "jobs_lost": len(lost),
        "done_rows_written_again": len(touched),
        "jobs_claimed_more_than_once": sum(n for a, n in attempts.items() if a > 1),
        "jobs_started_more_than_once": starts_more_than_once,
        "jobs_run_to_end_more_than_once": ran_to_end_more_than_once,
        "why_more_than_once": "every earlier attempt was claimed by a worker that was killed",
        "claims_committed_just_after_their_workers_kill": claimed_after_kill,
        "attempts_histogram": dict(sorted(attempts.items())),
        "recovery_after_kill": summary(recovery),
        "drain_after_chaos_s": round(drain_seconds, 1),
        "sampler": sampler.figures(),
    }
    with capsys.disabled():
        print(record_figures("chaos_kill_9", figures))


def check_job(
    job_id: int,
    row: dict[str, Any],
    job_claims: list[Any],
    events: list[Entry],
    killed: dict[int, float],
) -> list[str]:
    """What must hold for one job; each broken rule is a line."""
    problems = []
    final, final_pid = row["attempts"], row["pid"]
    claimed = {c.attempt: c for c in job_claims}
    if [c.attempt for c in job_claims] != list(range(1, final + 1)):
        problems.append(f"job {job_id}: claims {[c.attempt for c in job_claims]}, attempts {final}")
        return problems
    if job_claims[-1].pid != final_pid:
        problems.append(f"job {job_id}: last claim by {job_claims[-1].pid}, row says {final_pid}")
    for claim in job_claims[:-1]:
        # A claim may commit just after its worker's kill: the server finishes the
        # statement it had already received. Nothing can come later from a dead process.
        if claim.pid not in killed or claim.at > killed[claim.pid] + IN_FLIGHT:
            problems.append(
                f"job {job_id}: attempt {claim.attempt} by {claim.pid}, a worker that was not"
                " killed, yet the job was claimed again"
            )
    seen: Counter[tuple[str, int]] = Counter()
    for event in events:
        seen[event.event, event.attempt] += 1
        claim = claimed.get(event.attempt)
        if claim is None or claim.pid != event.pid:
            problems.append(f"job {job_id}: {event} is no claimed attempt's")
        if event.pid in killed and event.at > killed[event.pid]:
            problems.append(f"job {job_id}: {event} after its process was killed")
    doubled = [key for key, n in seen.items() if n > 1]
    if doubled:
        problems.append(f"job {job_id}: {doubled} more than once in one attempt")
    final_ends = [e for e in events if e.event == "end" and e.attempt == final]
    if len(final_ends) != 1 or final_ends[0].pid != final_pid:
        problems.append(f"job {job_id}: ends of its last attempt {final}: {final_ends}")
    elif row["finished"] < final_ends[0].at - 0.001:
        # Marked done before the attempt it names had finished: someone else's write.
        problems.append(f"job {job_id}: done at {row['finished']}, before its end {final_ends}")
    return problems
