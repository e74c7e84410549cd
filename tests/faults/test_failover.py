"""The primary fails, a synchronous standby is promoted: asyncq follows it.

A primary and a streaming standby (``pg_basebackup -R``), synchronous replication
(``synchronous_standby_names`` on the primary names the standby), both on free ports of
127.0.0.1, and a DSN that lists both with ``target_session_attrs=read-write``: libpq
connects to whichever of them takes writes. Every commit asyncq acknowledges is on the
standby before the primary answers, so a failover loses none of them.

- `test_workers_and_an_app_follow_a_promoted_standby`: two workers, a deferrer and an
  App (`failover_client.py`: defers through the batcher's kept connection, and a waiting
  ``app.result``) run against the DSN; the primary is stopped hard (``pg_ctl stop -m
  immediate``) and the standby promoted. Every part reconnects to the new primary, no
  acknowledged job is lost, the jobs running at the crash are finished or taken back by
  their leases.
- `test_a_worker_on_a_read_only_server_moves_to_the_writable_one`: a switchover. The
  primary is fenced read-only (``default_transaction_read_only``, as failover tools do
  before promoting another server) and the standby promoted: the worker's connections
  to the old primary stay open, and every write on them fails with
  ``ReadOnlySqlTransaction``. The worker must drop them and reconnect (libpq then skips
  the read-only server, or the address leads elsewhere), not retry its writes on them
  forever. (With ``target_session_attrs=read-write`` libpq never opens a connection to
  a standby, and a server becomes a standby only through a restart, which breaks every
  connection: a fenced primary, or an address that moved, is how a live connection ends
  up on a read-only server.)
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
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
from tests.faults.test_server_faults import check_job, job_ms, started
from tests.harness.app import WORK
from tests.harness.jobs import insert_jobs
from tests.harness.processes import REPO
from tests.harness.proxy import Proxy
from tests.harness.waiting import wait_until

STANDBY = "asyncq_standby"  # the standby's application_name
WORKERS = 2
CONCURRENCY = 10
LEASE = 4.0
LONG_MS = [500, 1000, 2000, 3000, 8000, 8000]  # in flight at the crash; two outlast the lease
RESULT_MS = 3000  # the App's waited-for jobs: one is waited for at the crash
RECONNECT_WITHIN = 10.0  # a correctness limit: each part is back on the new primary by then


class Pair:
    """A primary and its synchronous standby, destroyed after the test."""

    def __init__(self) -> None:
        self.primary = ControlledPostgres()
        self.standby: ControlledPostgres | None = None

    def start(self, dbname: str) -> str:
        """Start both, with ``dbname`` migrated on the primary; the two-host DSN of it."""
        self.primary.init()
        self.primary.start()
        create_database(self.primary, dbname, history=True)
        self.standby = self.primary.standby(STANDBY)
        self.standby.start()
        self.primary.synchronous(STANDBY)
        return self.dsn(dbname)

    def dsn(self, dbname: str) -> str:
        assert self.standby is not None
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def destroy(self) -> None:
        for server in (self.primary, self.standby):
            if server is not None:
                server.destroy()


@pytest.fixture
def pair() -> Iterator[Pair]:
    servers = Pair()
    try:
        yield servers
    finally:
        servers.destroy()


def activity(server: ControlledPostgres, dbname: str) -> list[tuple[str, str]]:
    """(application_name, query) of every asyncq connection to ``dbname`` on ``server``."""
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=2) as conn:
        rows = conn.execute(
            "SELECT application_name, query FROM pg_stat_activity"
            " WHERE application_name LIKE 'asyncq:%%' AND datname = %s",
            (dbname,),
        ).fetchall()
    return [(str(a), str(q)) for a, q in rows]


def connected(server: ControlledPostgres, dbname: str, pid: int, role: str) -> bool:
    """Process ``pid`` has its own connection of ``role`` (``listener``: a worker's LISTEN
    connection; ``results``: an App's) on ``server``; either listens once it is open."""
    return f"asyncq:{pid}:{role}" in {a for a, _ in activity(server, dbname)}


class Client:
    """``failover_client.py`` in a process of its own; its events from its stdout."""

    def __init__(self, env: dict[str, str], folder: Path, *options: str) -> None:
        self.out = folder / "client.jsonl"
        self.err = folder / "client.log"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.failover_client", str(RESULT_MS), *options],
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        self.pid = self.popen.pid

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines()
        found = [json.loads(line) for line in lines if line.endswith("}")]
        return [e for e in found if e["event"] == kind]

    def stop(self) -> int:
        self.popen.terminate()
        return self.popen.wait(30)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


def first_done_by_worker(db: Db, since: float) -> dict[int, float]:
    """Each worker's first job finished after ``since`` (database time, epoch s)."""
    rows = db.rows(
        "SELECT locked_by, extract(epoch FROM min(finished_at))::float8 FROM asyncq_jobs"
        " WHERE finished_at > to_timestamp(%s) GROUP BY locked_by",
        since,
    )
    return {int(w.rsplit(":", 2)[1]): at for w, at in rows}


def caught_up_at(
    deferrer: Deferrer, finished: dict[int, float], crash_at: float, promoted_at: float
) -> float:
    """When the workers are back at full throughput: every job the deferrer committed
    before the promotion is done, and from then on every job it commits is done as
    quickly as the slowest of those it committed in the 5 s before the crash (but the
    last second's, which the crash may catch)."""
    latency = {
        at: finished.get(deferrer.committed[tag], float("inf")) - at
        for tag, at in deferrer.committed_at.items()
    }
    usual = max(d for at, d in latency.items() if crash_at - 6 <= at < crash_at - 1)
    backlog = max(at + d for at, d in latency.items() if at < promoted_at)
    slow_after = [at for at, d in latency.items() if at >= promoted_at and d > usual]
    return max(backlog, max(slow_after, default=promoted_at))


@pytest.mark.timeout(150)
def test_workers_and_an_app_follow_a_promoted_standby(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "failover"
    dsn = pair.start(name)
    standby = pair.standby
    assert standby is not None
    workers = fault_workers(dsn, tmp_path)
    seed = random.randrange(1 << 30)
    client: Client | None = None
    try:
        with Sampler(pair.dsn("postgres"), name) as sampler, Db(dsn) as db:
            procs = [
                workers.start("--concurrency", str(CONCURRENCY), lease=LEASE, ready=False)
                for _ in range(WORKERS)
            ]
            for proc in procs:
                proc.wait_ready(30)
            client = Client(workers.env(), tmp_path)
            with Deferrer(
                dsn, per_tick=4, tick=0.1, ms=job_ms, max_attempts=5, seed=seed
            ) as deferrer:
                wait_until(lambda: count_done(db) >= 200, 30, "200 jobs done before the crash")
                wait_until(lambda: client.events("result"), 30, "the App to get a result")
                long_ids = insert_jobs(db.conn, WORK, [{"ms": ms} for ms in LONG_MS])
                wait_until(lambda: started(workers, long_ids), 10, "the long jobs to start")
                crash_at = time.time()
                pair.primary.stop("immediate")
                standby.promote()
                promoted_at = time.time()
                db.close()  # its server is gone

                wait_until(
                    lambda: len(first_done_by_worker(db, promoted_at)) == WORKERS,
                    RECONNECT_WITHIN,
                    "every worker to complete a job on the new primary",
                )
                first_done = first_done_by_worker(db, promoted_at)
                wait_until(
                    lambda: all(connected(standby, name, p.pid, "listener") for p in procs),
                    RECONNECT_WITHIN,
                    "every worker's LISTEN connection on the new primary",
                )
                wait_until(
                    lambda: connected(standby, name, client.pid, "results"),
                    RECONNECT_WITHIN,
                    "the App's results LISTEN connection on the new primary",
                )
                wait_until(
                    lambda: [
                        e for e in client.events("defer") if e["ok"] and e["began"] > promoted_at
                    ],
                    RECONNECT_WITHIN,
                    "the App to defer again",
                )
                wait_until(
                    lambda: [
                        e
                        for e in client.events("result")
                        if e["began"] < crash_at < promoted_at < e["ended"]
                    ],
                    RECONNECT_WITHIN + RESULT_MS / 1000,
                    "the result waited for at the crash",
                )
                time.sleep(2)  # and a little more work after it
            client_exit = client.stop()
            acked = [e["job"] for e in client.events("defer") if e["ok"]]
            ids = [*deferrer.committed.values(), *long_ids, *acked]
            wait_until(lambda: not_done(db, ids) == 0, 60, "every acknowledged job to be done")
            alive = {p.pid: p.alive for p in procs}
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            changes = transitions(db)
            touched = done_touched(db)
            finished = dict(
                db.rows(
                    "SELECT id, extract(epoch FROM finished_at)::float8 FROM asyncq_jobs"
                    " WHERE finished_at IS NOT NULL"
                )
            )
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()
        if client is not None:
            client.kill()

    waited = [e for e in client.events("result") if e["began"] < crash_at < e["ended"]]
    defers = client.events("defer")
    lost = [i for i in ids if rows.get(i, {}).get("status") != "done"]
    full_at = caught_up_at(deferrer, finished, crash_at, promoted_at)
    again = [i for i in rows if len([e for e in ledger.get(i, []) if e.event == "start"]) > 1]
    figures: dict[str, Any] = {
        "seed": seed,
        "lease_s": LEASE,
        "crash_to_promoted_s": round(promoted_at - crash_at, 3),
        "promotion_to_first_job_done_s": round(min(first_done.values()) - promoted_at, 3),
        "promotion_to_every_worker_job_done": summary(
            [at - promoted_at for at in first_done.values()]
        ),
        "promotion_to_full_throughput_s": round(full_at - promoted_at, 3),
        "promotion_to_app_defer_s": round(
            min(e["ended"] for e in defers if e["ok"] and e["began"] > promoted_at) - promoted_at, 3
        ),
        "result_waited_through_failover_s": [round(e["ended"] - e["began"], 3) for e in waited],
        "app_defers_failed": sum(1 for e in defers if not e["ok"]),
        "jobs_acknowledged": len(ids),
        "inserts_with_unknown_outcome": len(deferrer.uncertain) // 4,
        "jobs_lost": len(lost),
        "jobs_in_flight_at_crash": len(long_ids),
        "jobs_started_more_than_once": len(again),
        "sampler": sampler.figures(),
    }
    with capsys.disabled():
        print(record_figures("failover_promoted_standby", figures))

    assert client_exit == 0, client.err.read_text()
    assert "Traceback" not in client.err.read_text(), client.err.read_text()
    assert all(alive.values()), f"a worker died: {alive}"
    assert set(exits.values()) == {0}, exits
    assert not lost, f"{len(lost)} acknowledged jobs not done, e.g. {lost[:10]}"
    by_tag = {row["tag"]: row for row in rows.values()}
    unsure = [by_tag[t]["status"] for t in deferrer.uncertain if t in by_tag]
    assert set(unsure) <= {"done"}, unsure
    assert waited and all(e["ok"] for e in waited), waited
    assert not touched, f"done rows updated: {touched[:5]}"
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    sampler.check()
    problems: list[str] = []
    troubled: list[int] = []
    for job_id, row in rows.items():
        found = check_job(job_id, row, history[job_id], ledger.get(job_id, []), promoted_at)
        if found:
            problems += found
            troubled.append(job_id)
    assert not problems, (
        f"{len(problems)} problems:\n"
        + "\n".join(problems[:30])
        + "\n"
        + explain(workers, troubled[:5], changes, ledger)
    )


def fence(server: ControlledPostgres) -> None:
    """Make ``server`` refuse writes, its open sessions' too, as failover tools fence an
    old primary; libpq's ``target_session_attrs=read-write`` passes it over from then on."""
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        conn.execute("SELECT pg_reload_conf()")


HEALTH_INTERVAL = 2.0  # the worker's --listener-health-interval


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reached_by", ["two_hosts", "moved_address"])
def test_a_worker_on_a_read_only_server_moves_to_the_writable_one(
    reached_by: str, pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The old primary is fenced read-only and the standby promoted: the connections
    open to the old one stay up, and take no writes. The worker's claims, heartbeats and
    outcomes and its LISTEN connection, and an App that waits for results, must move to
    the new primary, within a bound, not retry on the read-only server forever.

    ``two_hosts``: their DSN lists both servers, ``target_session_attrs=read-write``.
    ``moved_address``: their DSN names one address (a TCP proxy, as a virtual IP or a
    load balancer would be), without ``target_session_attrs``, and the address moves to
    the new primary at the promotion: connections made through it before stay on the
    old one."""
    name = "read_only"
    dsn = pair.start(name)
    standby = pair.standby
    assert standby is not None
    proxy = Proxy(("127.0.0.1", pair.primary.port))
    workers = fault_workers(proxy.dsn(name) if reached_by == "moved_address" else dsn, tmp_path)
    client: Client | None = None
    try:
        with Db(dsn) as db:
            worker = workers.start(
                *("--concurrency", "4", "--listener-health-interval", str(HEALTH_INTERVAL)),
                lease=LEASE,
            )
            client = Client(workers.env(), tmp_path, "--wait-only")
            warm = insert_jobs(db.conn, WORK, [{"ms": 0} for _ in range(20)])
            wait_until(lambda: not_done(db, warm) == 0, 20, "the first jobs to be done")
            wait_until(lambda: client.events("result"), 30, "the App to get a result")
            [long_id] = insert_jobs(db.conn, WORK, [{"ms": 2 * LEASE * 1000}])
            wait_until(lambda: started(workers, [long_id]), 10, "the long job to start")
            fenced_at = time.time()
            fence(pair.primary)
            standby.promote()
            proxy.upstream = ("127.0.0.1", standby.port)  # new connections: the new primary
            promoted_at = time.time()
            db.close()  # on the old primary: the next statement goes to the new one
            [new_id] = insert_jobs(db.conn, WORK, [{"ms": 0}])
            wait_until(
                lambda: not_done(db, [new_id]) == 0,
                RECONNECT_WITHIN,
                "a job deferred on the new primary to be done",
            )
            new_done_at = time.time()
            wait_until(
                lambda: connected(standby, name, worker.pid, "listener"),
                RECONNECT_WITHIN,
                "the worker's LISTEN connection on the new primary",
            )
            listener_at = time.time()
            wait_until(
                lambda: [e for e in client.events("result") if e["began"] < fenced_at < e["ended"]],
                RECONNECT_WITHIN + RESULT_MS / 1000,
                "the result waited for at the switchover",
            )
            wait_until(lambda: not_done(db, [long_id]) == 0, 30, "the long job to be done")
            left_on_old = activity(pair.primary, name)
            client_exit = client.stop()
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()
        if client is not None:
            client.kill()
        proxy.close()

    waited = [e for e in client.events("result") if e["began"] < fenced_at < e["ended"]]
    figures = {
        "lease_s": LEASE,
        "listener_health_interval_s": HEALTH_INTERVAL,
        "fence_to_promoted_s": round(promoted_at - fenced_at, 3),
        "promotion_to_new_job_done_s": round(new_done_at - promoted_at, 3),
        "promotion_to_listener_on_new_primary_s": round(listener_at - promoted_at, 3),
        "result_waited_through_switchover_s": [round(e["ended"] - e["began"], 3) for e in waited],
        "asyncq_connections_left_on_old_primary": len(left_on_old),
        "long_job_attempts": rows[long_id]["attempts"],
    }
    with capsys.disabled():
        print(record_figures(f"failover_read_only_server_{reached_by}", figures))
    assert client_exit == 0, client.err.read_text()
    assert exits == {worker.pid: 0}, exits
    assert waited and all(e["ok"] for e in waited), waited
    assert not touched, touched
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    assert "Traceback" not in client.err.read_text(), client.err.read_text()
    for job_id, row in rows.items():
        assert row["status"] == "done", (job_id, row)
        assert not check_job(job_id, row, history[job_id], ledger.get(job_id, []), promoted_at)
    # Its heartbeats renewed the long job's lease on the new primary: it ran once.
    assert [e.event for e in ledger[long_id]] == ["start", "end"], ledger[long_id]


def count_done(db: Db) -> int:
    return int(db.value("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'"))
