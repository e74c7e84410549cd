"""Soak: one worker runs 100,000 jobs and 1,000 failing ones, in ten rounds, while its
LISTEN connection is killed three times and the server is restarted once.

Its resident memory, open file descriptors and server connections are measured after
the first round (warmed up), after the fifth and at the end: they must not grow. Every
job runs exactly once (the failing ones twice, then fail), as the ledger shows.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import (
    LISTENER,
    Db,
    Sampler,
    create_database,
    done_touched,
    fault_workers,
    proc_status,
    record_figures,
)
from tests.harness.app import FAIL, WORK
from tests.harness.processes import WorkerProcess
from tests.harness.waiting import wait_until

ROUNDS = 10
JOBS_PER_ROUND = 10_000
FAILING_PER_ROUND = 100
KILL_LISTENER_IN_ROUNDS = (2, 4, 7)  # while the round runs
RESTART_AFTER_ROUND = 5
RSS_GROWTH_LIMIT_KB = 30 * 1024

INSERT = """
INSERT INTO asyncq_jobs (task_name, args, max_attempts)
SELECT %(task)s, jsonb_build_object('tag', g), %(max_attempts)s
  FROM generate_series(%(first)s::int, %(last)s::int) AS g
"""
UNFINISHED = "SELECT count(*) FROM asyncq_jobs WHERE status IN ('queued', 'running')"
KILL_LISTENER = (
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
    + LISTENER
)


@pytest.mark.timeout(240)
def test_soak_memory_fds_and_connections_stay_flat(
    server: ControlledPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = create_database(server, "soak")
    workers = fault_workers(dsn, tmp_path)
    measured: dict[str, dict[str, int]] = {}
    listener_kills = 0
    began = time.monotonic()
    try:
        with Sampler(server.dsn(), "soak") as sampler, Db(dsn) as db:
            worker = workers.start(lease=30)

            def measure(label: str) -> None:
                snapshot = sampler.snapshot()
                measured[label] = {
                    **proc_status(worker.pid),
                    "connections": snapshot.connections.get(worker.pid, 0),
                    "listening": snapshot.listening.get(worker.pid, 0),
                }

            def unfinished() -> int:
                return int(db.value(UNFINISHED))

            measure("idle")
            for round_ in range(1, ROUNDS + 1):
                run_round(db, round_)
                if round_ in KILL_LISTENER_IN_ROUNDS:
                    wait_until(lambda: unfinished() < JOBS_PER_ROUND // 2, 60, "half a round")
                    kill_listener(db, worker)
                    listener_kills += 1
                wait_until(lambda: unfinished() == 0, 60, f"round {round_} to finish")
                if round_ == 1:
                    measure("start")
                if round_ == RESTART_AFTER_ROUND:
                    measure("middle")
                    with listener_back(worker):
                        server.restart("fast")
                    db.close()  # broken by the restart
            wait_until(lambda: sampler.snapshot().listening.get(worker.pid) == 1, 30, "one LISTEN")

            def settled() -> bool:
                # A socket the pools are opening, or one the server closed that a pool has
                # not used since, has a descriptor but no backend for a moment: a leak stays.
                measure("end")
                start, end = measured["start"], measured["end"]
                return end["fds"] - end["connections"] <= start["fds"] - start["connections"]

            with suppress(AssertionError):
                wait_until(settled, 15, "descriptors to match connections")
            soak_seconds = time.monotonic() - began
            exits = workers.stop_all()
            statuses = dict(
                db.rows(
                    "SELECT task_name || ' ' || status || ' ' || attempts, count(*)"
                    " FROM asyncq_jobs GROUP BY 1"
                )
            )
            errors = db.value(
                "SELECT count(*) FROM asyncq_jobs"
                " WHERE status = 'failed' AND last_error LIKE 'RuntimeError: job % fails%%'"
            )
            touched = done_touched(db)
        entries = workers.ledger.entries()
    finally:
        workers.kill_all()

    total, failing = ROUNDS * JOBS_PER_ROUND, ROUNDS * FAILING_PER_ROUND
    assert exits == {worker.pid: 0}, exits
    assert statuses == {f"{WORK} done 1": total, f"{FAIL} failed 2": failing}, statuses
    assert errors == failing
    # Every job started once, the failing ones twice (attempts 1 and 2); every job that
    # succeeded ran to its end exactly once.
    starts = Counter((e.job_id, e.attempt) for e in entries if e.event == "start")
    ends = Counter(e.job_id for e in entries if e.event == "end")
    assert set(starts.values()) == {1}, "an attempt started twice"
    assert Counter(Counter(job_id for job_id, _ in starts).values()) == {1: total, 2: failing}
    assert len(ends) == total and set(ends.values()) == {1}, "a job ran to its end twice"
    assert {e.pid for e in entries} == {worker.pid}
    assert not touched, touched
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    sampler.check()
    assert worker.stderr().count("listener reconnected") >= listener_kills + 1

    start, middle, end = measured["start"], measured["middle"], measured["end"]
    growth = {key: end[key] - start[key] for key in ("rss_kb", "fds", "connections")}
    figures: dict[str, Any] = {
        "jobs": total,
        "failing_jobs": failing,
        "listener_kills": listener_kills,
        "server_restarts": 1,
        "soak_s": round(soak_seconds, 1),
        "jobs_per_s": round((total + 2 * failing) / soak_seconds),
        "measured": measured,
        "growth_start_to_end": growth,
        "rss_growth_start_to_middle_kb": middle["rss_kb"] - start["rss_kb"],
        "sampler": sampler.figures(),
    }
    with capsys.disabled():
        print(record_figures("soak", figures))
    assert growth["rss_kb"] < RSS_GROWTH_LIMIT_KB, figures
    # A file descriptor is a socket to the server, or the loop's own: no more of them
    # than of connections. After the restart the pools open connections again as their
    # users ask for them at once, so the App's pool may come back one larger than it
    # was (seen: 5 -> 6); a connection kept at each of the four faults would add two
    # after the middle measure, or four after the first.
    assert growth["fds"] <= max(0, growth["connections"]), figures
    assert end["connections"] <= max(start["connections"], middle["connections"]) + 1, figures
    assert end["connections"] <= start["connections"] + 1, figures
    assert end["listening"] == 1, figures


def run_round(db: Db, round_: int) -> None:
    """Insert a round's jobs: the failing ones first, so their retries mix with the rest."""
    first = (round_ - 1) * JOBS_PER_ROUND + 1
    with db.conn.transaction():
        db.conn.execute(
            INSERT,
            {
                "task": FAIL,
                "max_attempts": 2,
                "first": -(first + FAILING_PER_ROUND - 1),
                "last": -first,
            },
        )
        db.conn.execute(
            INSERT,
            {"task": WORK, "max_attempts": 3, "first": first, "last": first + JOBS_PER_ROUND - 1},
        )


def kill_listener(db: Db, worker: WorkerProcess) -> None:
    """Terminate the worker's LISTEN backend; wait for the listener to come back."""
    with listener_back(worker):
        killed = db.value(KILL_LISTENER, f"asyncq:{worker.pid}")
        assert killed == 1, f"terminated {killed} LISTEN connections of worker {worker.pid}"


@contextmanager
def listener_back(worker: WorkerProcess) -> Iterator[None]:
    """Wait, after the block, until the worker's listener has reconnected once more."""
    before = worker.stderr().count("listener reconnected")
    yield
    wait_until(
        lambda: worker.stderr().count("listener reconnected") > before,
        30,
        "the listener to reconnect",
    )
