"""PostgreSQL goes away under running workers, and comes back.

Three faults, while two workers run a steady stream of jobs: ``pg_ctl restart -m
fast``; ``pg_ctl stop -m immediate`` then start (a crash: the server runs crash
recovery); and an outage of 15 s, longer than the pool's 10 s timeout. The workers
must stay alive and resume within seconds of the server being back, every job whose
INSERT committed must end done, jobs done before the fault stay done, and a job runs
again only if the server was away for longer than its lease.
"""

from __future__ import annotations

import random
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from tests.harness.app import WORK
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Entry
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

WORKERS = 2
CONCURRENCY = 10
OUTAGE = 15.0  # longer than the App's default connect_timeout (10 s), the pool's timeout


@dataclass(frozen=True)
class Fault:
    name: str
    lease: float  # the workers' --lease
    away: float  # about how long the server is away
    act: Callable[[ControlledPostgres], None]


def restart(pg: ControlledPostgres) -> None:
    pg.restart("fast")


def crash(pg: ControlledPostgres) -> None:
    pg.stop("immediate")
    pg.start()


def outage(pg: ControlledPostgres) -> None:
    pg.stop("fast")
    time.sleep(OUTAGE)
    pg.start()


FAULTS = {
    # A lease longer than the server is away: no lease may lapse, no job may run twice,
    # though the jobs that outlast the fault outlast their lease too (heartbeats renew it).
    "restart_fast": Fault("restart_fast", 4.0, 1.0, restart),
    "crash_immediate": Fault("crash_immediate", 4.0, 1.0, crash),
    # A lease shorter than the outage: the jobs running when the server went away may
    # lose their lease (a reaper may take them back before their worker renews it or
    # writes their outcome); they then run again, and the earlier outcome is refused.
    "outage_15s": Fault("outage_15s", 5.0, OUTAGE, outage),
}
LONG_MS = [500, 1000, 2000, 3000, 4000]


def job_ms(rng: random.Random) -> int:
    return rng.choice((0, 0, 20, 50, 100, 200))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_workers_survive_the_server_going_away(
    fault: str, server: ControlledPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = FAULTS[fault]
    dsn = create_database(server, fault, history=True)
    workers = fault_workers(dsn, tmp_path)
    seed = random.randrange(1 << 30)
    options = ("--concurrency", str(CONCURRENCY))
    try:
        with Sampler(server.dsn(), fault) as sampler, Db(dsn) as db:
            procs = [workers.start(*options, lease=spec.lease, ready=False) for _ in range(WORKERS)]
            for proc in procs:
                proc.wait_ready(30)
            with Deferrer(
                dsn, per_tick=4, tick=0.1, ms=job_ms, max_attempts=5, seed=seed
            ) as deferrer:
                wait_until(lambda: count_done(db) >= 100, 30, "100 jobs done before the fault")
                # Jobs in flight when the server goes away: some end while it is away, two
                # outlast it (and, in the outage, their lease). Each must be done once.
                outlast = round((spec.away + 5) * 1000)
                long_ms = [*LONG_MS, outlast, outlast]
                long_ids = insert_jobs(db.conn, WORK, [{"ms": ms} for ms in long_ms])
                wait_until(lambda: started(workers, long_ids), 10, "the long jobs to start")
                connections_before = sampler.snapshot().connections
                done_before = {
                    r[0] for r in db.rows("SELECT id FROM asyncq_jobs WHERE status = 'done'")
                }
                fault_at = time.time()
                spec.act(server)
                ready_at = time.time()

                def resumed() -> dict[int, float]:
                    rows = db.rows(
                        "SELECT locked_by, extract(epoch FROM min(finished_at))::float8"
                        " FROM asyncq_jobs WHERE finished_at > to_timestamp(%s)"
                        " GROUP BY locked_by",
                        ready_at,
                    )
                    return {int(w.rsplit(":", 2)[1]): at for w, at in rows}

                wait_until(
                    lambda: len(resumed()) == WORKERS,
                    90,
                    "every worker to complete a job after the fault",
                )
                first_done = resumed()
                time.sleep(2)  # and a little more work after it
            ids = [*deferrer.committed.values(), *long_ids]
            wait_until(lambda: not_done(db, ids) == 0, 90, "every committed job to be done")
            connections_after = sampler.snapshot().connections
            alive = {p.pid: p.alive for p in procs}
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            changes = transitions(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    assert all(alive.values()), f"a worker died: {alive}"
    assert set(exits.values()) == {0}, exits
    lost = [t for t, i in deferrer.committed.items() if rows.get(i, {}).get("status") != "done"]
    lost += [i for i in long_ids if rows[i]["status"] != "done"]
    assert not lost, f"{len(lost)} committed jobs not done, e.g. {lost[:10]}"
    by_tag = {row["tag"]: row for row in rows.values()}
    unsure = [by_tag[t]["status"] for t in deferrer.uncertain if t in by_tag]
    assert set(unsure) <= {"done"}, unsure
    undone = [i for i in done_before if rows.get(i, {}).get("status") != "done"]
    assert not undone, f"jobs done before the fault are no longer done: {undone[:10]}"
    assert not touched, f"done rows updated: {touched[:5]}"
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    sampler.check()

    problems: list[str] = []
    troubled: list[int] = []
    again: list[int] = []
    for job_id, row in rows.items():
        events = ledger.get(job_id, [])
        found = check_job(job_id, row, history[job_id], events, ready_at)
        if found:
            problems += found
            troubled.append(job_id)
        if len([e for e in events if e.event == "start"]) > 1:
            again.append(job_id)
    assert not problems, (
        f"{len(problems)} problems:\n"
        + "\n".join(problems[:30])
        + "\n"
        + explain(workers, troubled[:5], changes, ledger)
    )
    # A worker stops a job it could not renew for 0.8 of the lease (its self-fence): after
    # a restart its pool's new connections may come too late for that, even when the
    # server was away for less than the lease. Such a job runs again elsewhere, never
    # while its first run goes on.
    fenced = {
        int(n)
        for w in workers.started
        for n in re.findall(r"job (\d+) \(\S+\): lease not renewed", w.stderr())
    }
    for job_id in again:
        runs = sorted(ledger[job_id], key=lambda e: e.at)
        for earlier in [e for e in runs if e.event == "start"]:
            ends = [
                e.at for e in runs if e.event in ("end", "cancel") and e.attempt == earlier.attempt
            ]
            later = [e for e in runs if e.event == "start" and e.attempt > earlier.attempt]
            assert not later or (ends and min(ends) < later[0].at), runs
    if spec.lease > ready_at - fault_at:
        unfenced = [i for i in again if i not in fenced]
        assert not unfenced, f"jobs ran twice though no lease could lapse: {unfenced[:10]}"

    reconnect = [at - ready_at for at in first_done.values()]
    figures: dict[str, Any] = {
        "seed": seed,
        "lease_s": spec.lease,
        "server_away_s": round(ready_at - fault_at, 2),
        "reconnect_after_server_ready": summary(reconnect),
        "jobs_deferred": len(deferrer.committed) + len(long_ids),
        "inserts_with_unknown_outcome": len(deferrer.uncertain) // 4,
        "jobs_done_before_fault": len(done_before),
        "jobs_in_flight_at_fault": len(long_ids),
        "jobs_lost": len(lost),
        "jobs_started_more_than_once": len(again),
        "jobs_stopped_by_the_self_fence": len(fenced),
        "why_more_than_once": "the server was away longer than the lease (outage only), or"
        " renewals did not get through for 0.8 of it (self-fence)",
        "worker_connections_before": sorted(connections_before.values()),
        "worker_connections_after": sorted(connections_after.values()),
        "sampler": sampler.figures(),
    }
    with capsys.disabled():
        print(record_figures(f"server_{fault}", figures))


def count_done(db: Db) -> int:
    return int(db.value("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'"))


def started(workers: Workers, ids: list[int]) -> bool:
    ledger = workers.ledger.by_job()
    return all(ledger.get(i) for i in ids)


def check_job(
    job_id: int, row: dict[str, Any], job_claims: list[Any], events: list[Entry], ready_at: float
) -> list[str]:
    """What must hold for one job; each broken rule is a line."""
    problems = []
    final, final_pid = row["attempts"], row["pid"]
    claimed = {c.attempt: c for c in job_claims}
    if [c.attempt for c in job_claims] != list(range(1, final + 1)):
        return [f"job {job_id}: claims {[c.attempt for c in job_claims]}, attempts {final}"]
    if job_claims[-1].pid != final_pid:
        problems.append(f"job {job_id}: last claim by {job_claims[-1].pid}, row says {final_pid}")
    for claim in job_claims[:-1]:
        if claim.at > ready_at:
            problems.append(f"job {job_id}: attempt {claim.attempt} claimed after the fault lost")
    for event in events:
        claim = claimed.get(event.attempt)
        if claim is None or claim.pid != event.pid:
            problems.append(f"job {job_id}: {event} is no claimed attempt's")
    final_ends = [e for e in events if e.event == "end" and e.attempt == final]
    if len(final_ends) != 1 or final_ends[0].pid != final_pid:
        problems.append(f"job {job_id}: ends of its last attempt {final}: {final_ends}")
    elif row["finished"] < final_ends[0].at - 0.001:
        problems.append(f"job {job_id}: done at {row['finished']}, before its end {final_ends}")
    return problems


# The pools retry a failed connection after about 1, 3, 7, 15 and 31 s: a server back
# 17 s after it went away is just past the fourth try, and would wait for the fifth.
LONG_OUTAGE = 17.0
SHORT_LEASE = 4.0  # a heartbeat every second
RESUME_WITHIN = 6.0


@pytest.mark.timeout(120)
def test_a_worker_resumes_promptly_after_a_long_outage(
    server: ControlledPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once the server is back, a worker claims a new job within seconds, and renews its
    lease within the lease: it does not sit out its pools' reconnection backoff, which
    after an outage of a minute or more could last longer than any lease."""
    dsn = create_database(server, "resume_after_outage", history=True)
    workers = fault_workers(dsn, tmp_path)
    try:
        with Sampler(server.dsn(), "resume_after_outage") as sampler, Db(dsn) as db:
            worker = workers.start("--concurrency", "2", lease=SHORT_LEASE)
            warm = insert_jobs(db.conn, WORK, [{"ms": 1500}])  # pools and heartbeat in use
            wait_until(lambda: not_done(db, warm) == 0, 20, "a first job to be done")
            server.stop("fast")
            time.sleep(LONG_OUTAGE)
            server.start()
            ready_at = time.time()
            db.close()  # broken by the outage
            [job_id] = insert_jobs(db.conn, WORK, [{"ms": 3 * SHORT_LEASE * 1000}])

            def lease() -> tuple[Any, ...]:
                """(locked_at, attempts, status) of the job; locked_at 0 until claimed."""
                return db.rows(
                    "SELECT coalesce(extract(epoch FROM locked_at)::float8, 0), attempts,"
                    " status::text FROM asyncq_jobs WHERE id = %s",
                    job_id,
                )[0]

            first = wait_until(lambda: (now := lease())[0] and now, 60, "the job to be claimed")
            renewed = wait_until(
                lambda: (now := lease())[0] > first[0] and now, 30, "the lease to be renewed"
            )
            wait_until(lambda: not_done(db, [job_id]) == 0, 60, "the job to be done")
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    figures = {
        "outage_s": LONG_OUTAGE,
        "lease_s": SHORT_LEASE,
        "claimed_after_server_ready_s": round(first[0] - ready_at, 3),
        "first_renewal_after_claim_s": round(renewed[0] - first[0], 3),
        "attempts": rows[job_id]["attempts"],
    }
    with capsys.disabled():
        print(record_figures("server_resume_after_long_outage", figures))
    assert exits == {worker.pid: 0}, exits
    assert not touched, touched
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    sampler.check()
    assert first[0] - ready_at < RESUME_WITHIN, figures
    assert renewed[1] == 1 and renewed[2] == "running", renewed  # renewed, not reaped
    assert renewed[0] - first[0] < SHORT_LEASE, figures
    assert [c.attempt for c in history[job_id]] == [1], history[job_id]
    assert [e.event for e in ledger[job_id]] == ["start", "end"], ledger[job_id]


FROZEN_OUTAGE = 8.0
FROZEN_LEASE = 3.0


@pytest.mark.timeout(120)
def test_outcomes_a_frozen_worker_held_through_an_outage_are_refused(
    server: ControlledPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server goes away; the jobs of one worker end while it is away, and that
    worker is frozen (SIGSTOP: a paused VM) with their outcomes waiting to be written.
    The server comes back; the other worker's reaper takes the jobs back and runs them.
    Thawed, the frozen worker retries its outcomes over new connections: every one must
    be refused, and no done row touched. (Frozen while its jobs ran, it would stop them
    when thawed, by its self-fence, and write nothing: `test_frozen_worker.py`.)"""
    dsn = create_database(server, "frozen_outage", history=True)
    workers = fault_workers(dsn, tmp_path)
    options = ("--concurrency", "5")
    try:
        with Sampler(server.dsn(), "frozen_outage") as sampler, Db(dsn) as db:
            frozen, other = (workers.start(*options, lease=FROZEN_LEASE) for _ in range(2))
            ids = insert_jobs(db.conn, WORK, [{"ms": 1500} for _ in range(10)])
            wait_until(lambda: started(workers, ids), 10, "the jobs to start")
            away_at = time.monotonic()
            server.stop("fast")
            # Its jobs end (1.5 s) before its self-fence would stop them (2.4 s after the
            # claim at least): their outcomes wait for the server.
            mine = [i for i in ids if workers.ledger.first_start(i).pid == frozen.pid]  # type: ignore[union-attr]
            wait_until(
                lambda: all(workers.ledger.events("end", i) for i in mine),
                5,
                "the frozen worker's jobs to end",
            )
            frozen.send(signal.SIGSTOP)
            time.sleep(FROZEN_OUTAGE - (time.monotonic() - away_at))
            server.start()
            ready_at = time.time()
            db.close()  # broken by the outage
            wait_until(lambda: not_done(db, ids) == 0, 60, "the other worker to do every job")
            history = claims(db)
            taken_back = [i for i in ids if history[i][0].pid == frozen.pid]
            frozen.send(signal.SIGCONT)

            def refused() -> int:
                return frozen.stderr().count("before its outcome (done) was written")

            wait_until(
                lambda: refused() + len(done_touched(db)) >= len(taken_back),
                30,
                "the frozen worker to write its stale outcomes",
            )
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            changes = transitions(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    figures = {
        "outage_s": FROZEN_OUTAGE,
        "lease_s": FROZEN_LEASE,
        "jobs_of_the_frozen_worker": len(taken_back),
        "stale_outcomes_refused": refused(),
    }
    with capsys.disabled():
        print(record_figures("server_outage_frozen_worker", figures))
    assert taken_back, "the frozen worker held no job"
    assert not touched, f"done rows updated: {touched[:5]}"
    assert refused() == len(taken_back)
    assert exits == {frozen.pid: 0, other.pid: 0}, exits
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    sampler.check()
    problems = [p for i in ids for p in check_job(i, rows[i], history[i], ledger[i], ready_at)]
    assert not problems, "\n".join(problems) + "\n" + explain(workers, ids, changes, ledger)
    for job_id in taken_back:
        # The first attempt ran to its end on the frozen worker; the second, elsewhere,
        # is the one done.
        events = [(e.event, e.attempt, e.pid) for e in ledger[job_id]]
        assert ("end", 1, frozen.pid) in events, events
        assert rows[job_id]["attempts"] == 2 and rows[job_id]["pid"] == other.pid
