"""A hung proxy between a worker and PostgreSQL: every connection of the worker goes
silent at once, and the proxy's kernel still acknowledges every packet.

The worker (the defaults, but for a 30 s lease written out) reaches the server through
`tests.faults.proxy.Proxy`, its pools and its LISTEN connection alike; a `Deferrer`
writes jobs straight to the server all along. With jobs flowing and three long ones
running, the proxy wedges every connection open: it forwards nothing more on them, both
ways, and keeps their sockets open (a hung PgBouncer or cloud SQL proxy), so TCP
keepalives are answered and ``tcp_user_timeout`` never fires: only the worker's own
deadlines can tell. Two cases:

- ``new_connections_work``: connections made after the wedge are forwarded (a proxy
  whose old connections are stuck, its new ones fine). Every job deferred in the fault
  is done within `RECOVER_WITHIN` of the wedge.
- ``new_connections_hang``: new connections hang too, for `HANG` seconds (half of
  `RECOVER_WITHIN`), then are forwarded; the old ones stay wedged. Every job deferred
  in the fault is done within `RECOVER_WITHIN` of the wedge all the same.

In both, every job is done exactly once (the ledger: one start and one end; the status
history: one claim), the long jobs too (their outcomes and heartbeats get through on
new connections), no lease is lost, no done row is written again, no traceback, and
the worker is listening again afterwards. A claim the server ran just before the wedge,
whose answer the wedge swallowed, leaves its jobs to their lease (they run once, as
attempt 2, once the rescuer has taken them back): the test names them and leaves them
out of the bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import (
    CONNECTIONS_PER_WORKER,
    Db,
    Deferrer,
    claims,
    create_database,
    done_touched,
    explain,
    fault_workers,
    jobs,
    log_lines,
    not_done,
    record_figures,
    summary,
    transitions,
)
from tests.harness.app import WORK
from tests.harness.jobs import insert_jobs
from tests.harness.proxy import Proxy
from tests.harness.waiting import wait_until

LEASE = 30.0  # the default
RECOVER_WITHIN = 10.0
HANG = 5.0  # new connections hang this long in the second case
DEFER_FOR = 5.0  # seconds of new jobs from the wedge on
LONG_MS = (3000, 3000, 12000)  # running at the wedge: outcomes and a renewal in the fault
SLACK = 1.0  # a claim sent just before the wedge may commit just after it
WARM = 200  # jobs deferred before the wedge (10 s of them)


@pytest.fixture
def proxy(server: ControlledPostgres) -> Iterator[Proxy]:
    with Proxy(("127.0.0.1", server.port)) as made:
        yield made


def worker_connections(db: Db, pid: int) -> int:
    return int(
        db.value(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
            f"asyncq:{pid}%",
        )
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "new", ["forward", "hang"], ids=["new_connections_work", "new_connections_hang"]
)
def test_a_hung_proxy(
    new: Literal["forward", "hang"],
    proxy: Proxy,
    server: ControlledPostgres,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"hung_proxy_{new}"
    dsn = create_database(server, name, history=True)
    workers = fault_workers(dsn, tmp_path)
    deferrer = Deferrer(
        dsn, per_tick=2, tick=0.1, ms=lambda rng: rng.randint(0, 200), max_attempts=5, seed=43
    )
    try:
        with Db(dsn) as db:
            worker = workers.start(lease=LEASE, env=workers.env(ASYNCQ_DSN=proxy.dsn(name)))
            with deferrer:
                # Some seconds of work, as a worker that has been running has seen: the
                # calls of each kind have a pace.
                wait_until(lambda: len(deferrer.committed) >= WARM, 30, "jobs to flow")
                wait_until(
                    lambda: not_done(db, deferrer.committed.values()) < 10, 20, "jobs to be done"
                )
                long = insert_jobs(db.conn, WORK, [{"ms": ms} for ms in LONG_MS])
                wait_until(
                    lambda: all(workers.ledger.first_start(i) for i in long), 10, "the long jobs"
                )
                wait_until(lambda: len(proxy.listeners()) == 1, 5, "the LISTEN connection")
                wedged_at = time.time()
                wedged = proxy.wedge(new=new)
                if new == "hang":
                    time.sleep(HANG)
                    proxy.end()
                ended_at = time.time()
                time.sleep(max(0.0, wedged_at + DEFER_FOR - time.time()))
            committed = dict(deferrer.committed)
            in_fault = [i for t, i in committed.items() if deferrer.committed_at[t] > wedged_at]
            wait_until(lambda: not_done(db, committed.values()) == 0, 90, "every job to be done")
            wait_until(lambda: not_done(db, long) == 0, 30, "the long jobs to be done")
            wait_until(lambda: len(proxy.listeners()) == 1, 30, "a LISTEN connection again")
            probe_at = time.time()
            [probe] = insert_jobs(db.conn, WORK, [{"ms": 0}])
            wait_until(lambda: not_done(db, [probe]) == 0, 10, "the probe to be done")
            probe_s = time.time() - probe_at
            connections = worker_connections(db, worker.pid)
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            changes = transitions(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    # Claimed by a claim that ran just before the wedge and whose answer never came back:
    # no ledger line for that attempt, which the rescuer took back after its lease.
    swallowed = sorted(
        i
        for i, found in history.items()
        if found[0].at < wedged_at + SLACK
        and not any(e.attempt == found[0].attempt for e in ledger.get(i, []))
    )
    timed = [i for i in in_fault if i not in swallowed]
    done_after = [rows[i]["finished"] - wedged_at for i in timed]
    long_written_after = [
        rows[i]["finished"] - max(e.at for e in ledger[i] if e.event == "end") for i in long
    ]
    log = worker.stderr()
    reconnected = [at for at, text in log_lines(worker) if "listener reconnected" in text]
    figures: dict[str, Any] = {
        "lease_s": LEASE,
        "new_connections": new,
        "connections_wedged": wedged,
        "hang_s": round(ended_at - wedged_at, 2),
        "jobs_deferred_in_fault": len(in_fault),
        "first_done_after_fault_s": round(min(done_after), 2) if done_after else None,
        "last_done_after_fault_s": round(max(done_after), 2) if done_after else None,
        "done_after_fault": summary(done_after),
        "long_jobs_outcome_written_after_their_end_s": [round(s, 2) for s in long_written_after],
        "swallowed_claims": swallowed,
        "failures_logged": {
            what: log.count(what)
            for what in (
                "claim failed",
                "could not write outcomes",
                "heartbeat failed",
                "listener connection lost",
            )
        },
        "listener_reconnected_after_fault_s": [round(at - wedged_at, 2) for at in reconnected],
        "probe_done_after_listening_again_s": round(probe_s, 3),
        "worker_connections_at_end": connections,
    }
    with capsys.disabled():
        print(record_figures(f"hung_proxy_{new}", figures))

    assert exits == {worker.pid: 0}, exits
    assert not touched, touched
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    assert "lease lost" not in log and "lease not renewed" not in log, log[-5000:]
    assert in_fault, "no job deferred in the fault"
    for job_id, row in rows.items():
        assert row["status"] == "done", explain(workers, [job_id], changes, ledger)
        attempt = row["attempts"]
        assert [(e.event, e.attempt) for e in ledger[job_id]] == [
            ("start", attempt),
            ("end", attempt),
        ], explain(workers, [job_id], changes, ledger)
        expected = [1, 2] if job_id in swallowed else [1]
        assert [c.attempt for c in history[job_id]] == expected, explain(
            workers, [job_id], changes, ledger
        )
    late = {i: round(rows[i]["finished"] - wedged_at, 2) for i in timed}
    late = {i: s for i, s in late.items() if s >= RECOVER_WITHIN}
    assert not late, (late, figures, explain(workers, list(late)[:3], changes, ledger))
    # The wedged connections stay open on the server (it never hears of them again):
    # the worker's other connections stay within its bound.
    assert connections - wedged <= CONNECTIONS_PER_WORKER, figures
