"""A fleet: eight worker processes, each in a network namespace of its own (`netns.Fleet`),
as eight hosts sharing one PostgreSQL, and 100,000 jobs of 10 ms.

The server is a `ControlledPostgres` listening on 127.0.0.1 and on the host's end of
every namespace's link; worker ``i`` runs inside namespace ``i`` (``ip netns exec``)
and reaches the server at the host's address on its own link, so that
``pg_stat_activity.client_addr`` names the host of every connection. Two tests:

- calm: the 100,000 jobs are deferred at once (one plain INSERT) to a fleet that is
  ready; every job is claimed once, started and ended once, by the worker its row
  names (the history trigger and the ledger); no done row is touched. Throughput,
  connections per host, what the server's backends wait on, WAL per job and CPU are
  reported.
- faults: the same with a 6 s lease; once a fifth is done, two hosts'
  workers get ``kill -9`` and a third host's link goes silent for 15 s. Every job is
  done; each claim before a job's last was made by a killed worker (before its kill)
  or by the cut-off one (before its link came back): no job runs to its end twice
  except an attempt whose lease was lost with its worker; a killed worker wrote nothing
  after its death; the cut-off worker, back, has the outcome of every attempt it ran to
  its end after the job was claimed again refused, and exits cleanly at the end. The
  time from a kill, or from the silence, to the job's return to the queue (the rescuer)
  is bounded by the lease and a reaper interval; the time to its next start elsewhere
  (behind the jobs queued before it) is reported.

The figures go to ``results/last-run.json``; `benchmarks/fleet.py` measures the
throughput of 1, 2, 4 and 8 workers (nothing here asserts a speed).
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from asyncq.pools import DEADLINE
from asyncq.store import IDLE_LIMIT
from tests.faults.netns import Fleet
from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import (
    Claim,
    Db,
    Sampler,
    claims,
    connection_bound,
    create_database,
    done_touched,
    explain,
    fault_workers,
    jobs,
    record_figures,
    summary,
    transitions,
)
from tests.harness.app import WORK
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Entry
from tests.harness.processes import WorkerProcess, Workers

HOSTS = 8
CONCURRENCY = 25
BATCH = CONCURRENCY // 2  # two claim loops per worker
JOB_MS = 10
CALM_JOBS = 100_000
CALM_LEASE = 30.0
FAULT_JOBS = 100_000
LEASE = 6.0
REAP_INTERVAL = 2.0  # WorkerSettings.reap_interval
SILENT = 15.0
# A transaction the silence cuts off is the server's to end: after asyncq's IDLE_LIMIT,
# seen by a sample within the next second.
SILENCED_IDLE_LIMIT = float(IDLE_LIMIT.removesuffix("s")) + 1.0
FAULTS_AFTER = 0.2  # the share of the jobs done when the faults come
IN_FLIGHT = 5.0  # how long after a kill its last statement may still commit
# A claim the cut-off worker sent just before its link came back may commit after it,
# and be cut at its deadline: its jobs then wait for their lease like the others.
LATE_CLAIM = DEADLINE + 3.0


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    made = Fleet.make(HOSTS)
    try:
        yield made
    finally:
        made.destroy()


@pytest.fixture(scope="module")
def server(fleet: Fleet) -> Iterator[ControlledPostgres]:
    pg = ControlledPostgres()
    try:
        pg.init(also_on=fleet.host_ips, trusting=fleet.network)
        pg.start()
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def links(fleet: Fleet) -> Iterator[Fleet]:
    """The fleet, every link back up after the test, whatever happened."""
    try:
        yield fleet
    finally:
        for link in fleet.links:
            if link.silent:
                link.restore()


def start_fleet(
    workers: Workers, server: ControlledPostgres, dbname: str, fleet: Fleet, lease: float
) -> list[WorkerProcess]:
    """One worker on each host, each connecting over its own link; all ready."""
    options = ("--concurrency", str(CONCURRENCY), "--batch-size", str(BATCH))
    started = [
        workers.start(
            *options,
            lease=lease,
            ready=False,
            env=workers.env(ASYNCQ_DSN=server.dsn(dbname, host=link.host_ip)),
            prefix=link.prefix(),
        )
        for link in fleet.links
    ]
    for worker in started:
        worker.wait_ready(60)
    return started


def count_left(db: Db) -> int:
    """Jobs not ended yet (a job may end failed: the checks then say why)."""
    return int(db.value("SELECT count(*) FROM asyncq_jobs WHERE status IN ('queued', 'running')"))


def wait_left(db: Db, at_most: int, timeout: float, what: str) -> None:
    """Poll, twice a second (a count over the whole table costs the server)."""
    deadline = time.monotonic() + timeout
    while count_left(db) > at_most:
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.5)


# -- what the server does: connections per host, what its backends wait on ---------------

ACTIVITY = """
SELECT host(client_addr), application_name, state, wait_event_type, wait_event, query
  FROM pg_stat_activity
 WHERE datname = %s AND backend_type = 'client backend' AND application_name LIKE 'asyncq:%%'
"""


def kind_of(application_name: str) -> str:
    """The App's pool, the worker's own pool, or its LISTEN connection."""
    suffix = application_name.split(":")[-1]
    return suffix if suffix in ("worker", "listener") else "app"


def statement_of(query: str) -> str:
    if "SKIP LOCKED" in query:
        return "claim"
    if "status = 'done'" in query:
        return "done"
    if "SET locked_at" in query:
        return "heartbeat"
    return "other"


@dataclass
class Activity:
    """Samples ``pg_stat_activity`` every ``interval`` s in a thread: each host's
    connections (by ``client_addr``, and by kind), and, for every backend running a
    statement, what it waits on (``CPU`` when nothing) and which statement it runs."""

    server_dsn: str
    dbname: str
    interval: float = 0.2
    samples: int = 0
    per_host: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    per_host_kind: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    active: list[int] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)
    waits: Counter[str] = field(default_factory=Counter)
    waits_by_statement: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Activity:
        self._thread = threading.Thread(target=self._run, name="fleet activity")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.wait(self.interval):
            try:
                if conn is None:
                    conn = psycopg.connect(self.server_dsn, autocommit=True, connect_timeout=1)
                rows = conn.execute(ACTIVITY, (self.dbname,)).fetchall()
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
                continue
            hosts: Counter[str] = Counter()
            kinds: dict[str, Counter[str]] = defaultdict(Counter)
            active = 0
            for host, application_name, state, wait_type, wait_event, query in rows:
                hosts[host] += 1
                kinds[host][kind_of(application_name)] += 1
                if state == "active" and not query.lstrip().upper().startswith("LISTEN"):
                    active += 1
                    wait = f"{wait_type}:{wait_event}" if wait_type else "CPU"
                    self.waits[wait] += 1
                    self.waits_by_statement[f"{statement_of(query)} {wait}"] += 1
            for host, n in hosts.items():
                self.per_host[host].append(n)
                for kind, k in kinds[host].items():
                    self.per_host_kind[host][kind] = max(k, self.per_host_kind[host][kind])
            self.active.append(active)
            self.totals.append(len(rows))
            self.samples += 1
        if conn is not None:
            conn.close()

    def figures(self) -> dict[str, Any]:
        seen = sum(self.waits.values()) or 1
        most: Counter[str] = Counter()
        for kinds in self.per_host_kind.values():
            for kind, k in kinds.items():
                most[kind] = max(most[kind], k)
        return {
            "samples": self.samples,
            "hosts_seen": len(self.per_host),
            "connections_per_host_median": statistics.median(
                statistics.median(v) for v in self.per_host.values()
            ),
            "connections_per_host_max": max(max(v) for v in self.per_host.values()),
            "connections_per_host_max_by_kind": dict(most),
            "connections_total_max": max(self.totals, default=0),
            "active_backends_mean": round(statistics.mean(self.active), 2),
            "active_backends_waiting_on_pct": {
                k: round(100 * n / seen, 1) for k, n in self.waits.most_common(8)
            },
            "by_statement_pct": {
                k: round(100 * n / seen, 1) for k, n in self.waits_by_statement.most_common(10)
            },
        }


# -- WAL, commits per flush, CPU -----------------------------------------------------------


def server_counters(db: Db, dbname: str) -> dict[str, float]:
    """The WAL position, the WAL flushes (``pg_stat_io``, PostgreSQL 16+) and the
    database's commits."""
    db.rows("SELECT pg_stat_clear_snapshot()")
    lsn = db.value("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    fsyncs = db.value("SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'")
    commits = db.value("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", dbname)
    fpi = db.value("SELECT wal_fpi FROM pg_stat_wal")
    return {
        "wal_bytes": float(lsn),
        "wal_fsyncs": float(fsyncs),
        "commits": float(commits),
        "wal_fpi": float(fpi),
    }


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(server: ControlledPostgres) -> float:
    """The postmaster's and every live backend's CPU, and that of the backends it
    reaped (the postmaster's cutime and cstime)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == postmaster:
            total += sum(int(f) for f in fields[11:15]) / tick
        elif int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of every CPU since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@dataclass
class Meter:
    """Counters at the start of a drain, and what changed by its end."""

    db: Db
    dbname: str
    server: ControlledPostgres
    workers: list[WorkerProcess]
    start: dict[str, float] = field(default_factory=dict)

    def begin(self) -> None:
        self.start = {
            **server_counters(self.db, self.dbname),
            "server_cpu": server_cpu_seconds(self.server),
            "workers_cpu": sum(cpu_seconds(w.pid) for w in self.workers),
        }
        self.start["busy"], self.start["total"] = machine_busy()

    def end(self, jobs_done: int, alive: list[WorkerProcess]) -> dict[str, Any]:
        busy, total = machine_busy()
        now = server_counters(self.db, self.dbname)
        workers_cpu = sum(cpu_seconds(w.pid) for w in alive)
        commits = now["commits"] - self.start["commits"]
        fsyncs = now["wal_fsyncs"] - self.start["wal_fsyncs"]
        wal = now["wal_bytes"] - self.start["wal_bytes"]
        return {
            "wal_bytes_per_job": round(wal / jobs_done),
            "wal_full_page_images_per_job": round(
                (now["wal_fpi"] - self.start["wal_fpi"]) / jobs_done, 3
            ),
            "commits_per_job": round(commits / jobs_done, 3),
            "wal_fsyncs": int(fsyncs),
            "commits_per_wal_fsync": round(commits / fsyncs, 2) if fsyncs else None,
            "machine_busy_pct": round(
                100 * (busy - self.start["busy"]) / (total - self.start["total"]), 1
            ),
            "server_cpu_s": round(server_cpu_seconds(self.server) - self.start["server_cpu"], 1),
            # a killed worker's CPU is gone with it
            "workers_cpu_s": round(workers_cpu - self.start["workers_cpu"], 1)
            if len(alive) == len(self.workers)
            else None,
        }


def connections_of(db: Db, dbname: str, host: str, since: float) -> dict[str, dict[str, int]]:
    """A host's connections on the server, by kind: opened before ``since`` and after."""
    found: dict[str, dict[str, int]] = {"before_the_silence": {}, "since_the_silence": {}}
    rows = db.rows(
        "SELECT application_name, extract(epoch FROM backend_start)::float8 < %s"
        "  FROM pg_stat_activity WHERE datname = %s AND client_addr = %s::inet",
        since,
        dbname,
        host,
    )
    for application_name, older in rows:
        counts = found["before_the_silence" if older else "since_the_silence"]
        kind = kind_of(application_name)
        counts[kind] = counts.get(kind, 0) + 1
    return found


def drain_figures(db: Db, ids: list[int]) -> dict[str, Any]:
    """From the first claim to the last job done, by the database's clock."""
    first, last = db.rows(
        "SELECT (SELECT extract(epoch FROM min(at)) FROM faults_history"
        "         WHERE new_status = 'running'),"
        "       (SELECT extract(epoch FROM max(finished_at)) FROM asyncq_jobs)"
    )[0]
    seconds = float(last) - float(first)
    return {"drain_s": round(seconds, 2), "jobs_per_s": round(len(ids) / seconds)}


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_fleet_of_eight_hosts_does_every_job_once(
    links: Fleet, server: ControlledPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbname = "fleet_calm"
    dsn = create_database(server, dbname, history=True)
    workers = fault_workers(dsn, tmp_path)
    bound = connection_bound(CONCURRENCY)
    try:
        with (
            Sampler(server.dsn(), dbname, bound=bound) as sampler,
            Activity(server.dsn(), dbname) as activity,
            Db(dsn) as db,
        ):
            fleet = start_fleet(workers, server, dbname, links, CALM_LEASE)
            meter = Meter(db, dbname, server, fleet)
            before_insert = server_counters(db, dbname)["wal_bytes"]
            ids = insert_jobs(db.conn, WORK, [{"ms": JOB_MS}] * CALM_JOBS)
            meter.begin()
            insert_wal = meter.start["wal_bytes"] - before_insert
            wait_left(db, 0, 180, "every job to end")
            measured = meter.end(len(ids), fleet)
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            touched = done_touched(db)
            drained = drain_figures(db, ids)
            table = db.value("SELECT pg_total_relation_size('asyncq_jobs')")
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    by_pid = Counter(row["pid"] for row in rows.values())
    figures: dict[str, Any] = {
        "hosts": HOSTS,
        "concurrency": CONCURRENCY,
        "batch_size": BATCH,
        "jobs": len(ids),
        "job_ms": JOB_MS,
        **drained,
        "jobs_per_host": sorted(by_pid.values()),
        "insert_wal_bytes_per_job": round(insert_wal / len(ids)),
        **measured,
        # heap, indexes and TOAST, dead row versions included (no vacuum yet)
        "table_bytes_per_done_job": round(table / len(ids)),
        "wal_note": "drain WAL includes the test's history trigger (two rows per job)",
        "activity": activity.figures(),
        "sampler": sampler.figures(),
    }
    with capsys.disabled():
        print(record_figures("fleet_calm", figures))

    assert len(rows) == len(ids) == CALM_JOBS
    assert set(exits.values()) == {0}, exits
    assert not touched, f"done rows updated: {touched[:5]}"
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    sampler.check()
    pids = {w.pid for w in fleet}
    assert set(by_pid) == pids, f"not every host did jobs: {by_pid}"
    assert activity.figures()["hosts_seen"] == HOSTS, activity.per_host.keys()
    problems = []
    for job_id, row in rows.items():
        pid = row["pid"]
        events = [(e.event, e.attempt, e.pid) for e in ledger.get(job_id, [])]
        job_claims = [(c.attempt, c.pid) for c in history[job_id]]
        if row["status"] != "done" or job_claims != [(1, pid)]:
            problems.append(f"job {job_id}: {row}, claims {job_claims}")
        elif events != [("start", 1, pid), ("end", 1, pid)]:
            problems.append(f"job {job_id}: ledger {events}, done by {pid}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])


@pytest.mark.timeout(240)
def test_a_fleet_loses_two_hosts_and_a_link(
    links: Fleet, server: ControlledPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbname = "fleet_faults"
    dsn = create_database(server, dbname, history=True)
    workers = fault_workers(dsn, tmp_path)
    bound = connection_bound(CONCURRENCY)
    silenced = {links.links[2].ns_ip: SILENCED_IDLE_LIMIT}
    try:
        with (
            Sampler(server.dsn(), dbname, bound=bound, idle_limits=silenced) as sampler,
            Activity(server.dsn(), dbname) as activity,
            Db(dsn) as db,
        ):
            fleet = start_fleet(workers, server, dbname, links, LEASE)
            doomed, cut, link = fleet[:2], fleet[2], links.links[2]
            meter = Meter(db, dbname, server, fleet)
            ids = insert_jobs(db.conn, WORK, [{"ms": JOB_MS}] * FAULT_JOBS)
            meter.begin()
            wait_left(db, int(FAULT_JOBS * (1 - FAULTS_AFTER)), 120, "a fifth of the jobs")
            for worker in doomed:
                workers.kill9(worker)
            silent_at = time.time()
            link.silence()
            time.sleep(SILENT)
            link.restore()
            back_at = time.time()
            wait_left(db, 0, 180, "every job to end")
            measured = meter.end(len(ids), [w for w in fleet if w.alive])
            # Back on its link, the cut-off worker tries the outcomes it held: those of the
            # jobs claimed again since are refused. Checked at the end, after the rescue's.
            late = late_outcomes(claims(db), workers.ledger.by_job(), cut.pid)
            unrefused = wait_refused(cut, late, 30)
            # An outcome whose write committed but whose answer the silence swallowed is
            # refused on its retry too: a done one must not be reported as a lease lost.
            misreported = sorted(logged_lost(cut, "before its outcome (done)") - late.items())
            cut_off = connections_of(db, dbname, link.ns_ip, silent_at)
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            changes = transitions(db)
            touched = done_touched(db)
            drained = drain_figures(db, ids)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    killed = dict(workers.killed)
    lost_at = {**killed, cut.pid: silent_at}  # when each lost its leases
    claim_by = {pid: at + IN_FLIGHT for pid, at in killed.items()}
    claim_by[cut.pid] = back_at + LATE_CLAIM
    problems: list[str] = []
    troubled: list[int] = []
    # From the loss (the kill, the silence) to the job back in the queue (the rescuer),
    # and to its next start elsewhere (behind the jobs queued before it).
    rescued: dict[str, list[float]] = {"kill": [], "partition": []}
    restarted: dict[str, list[float]] = {"kill": [], "partition": []}
    claimed_again = ran_to_end_twice = 0
    for job_id, row in rows.items():
        job_claims = history[job_id]
        events = ledger.get(job_id, [])
        found = check_job(job_id, row, job_claims, events, killed, claim_by)
        if found:
            problems += found
            troubled.append(job_id)
        claimed_again += len(job_claims) > 1
        ran_to_end_twice += sum(e.event == "end" for e in events) > 1
        starts = [e for e in events if e.event == "start"]
        for claim in job_claims[:-1]:
            if claim.pid not in lost_at:
                continue
            why = "partition" if claim.pid == cut.pid else "kill"
            since = max(lost_at[claim.pid], claim.at)
            back = [
                at
                for at, old, new, attempt, _ in changes[job_id]
                if (old, new, attempt) == ("running", "queued", claim.attempt)
            ]
            if back:
                rescued[why].append(back[0] - since)
            later = [s for s in starts if s.attempt > claim.attempt and s.pid != claim.pid]
            if later:
                restarted[why].append(later[0].at - since)

    attempts = Counter(row["attempts"] for row in rows.values())
    figures: dict[str, Any] = {
        "hosts": HOSTS,
        "concurrency": CONCURRENCY,
        "lease_s": LEASE,
        "jobs": len(ids),
        "killed_hosts": len(killed),
        "silent_s": round(back_at - silent_at, 2),
        **drained,
        "jobs_lost": sum(row["status"] != "done" for row in rows.values()),
        "done_rows_written_again": len(touched),
        "jobs_claimed_more_than_once": claimed_again,
        "jobs_run_to_end_more_than_once": ran_to_end_twice,
        "why_more_than_once": "every earlier attempt's worker was killed or cut off",
        "attempts_histogram": dict(sorted(attempts.items())),
        "kill_to_rescued": summary(rescued["kill"]),
        "kill_to_next_start": summary(restarted["kill"]),
        "silence_to_rescued": summary(rescued["partition"]),
        "silence_to_next_start": summary(restarted["partition"]),
        "cut_off_outcomes_refused": len(late) - len(unrefused),
        "cut_off_done_reported_lost": len(misreported),
        **measured,
        "cut_off_host_connections_at_the_end": cut_off,
        "activity": activity.figures(),
        "sampler": sampler.figures(),
    }
    with capsys.disabled():
        print(record_figures("fleet_faults", figures))

    assert len(rows) == len(ids) == FAULT_JOBS
    assert figures["jobs_lost"] == 0, figures
    survivors = {w.pid for w in fleet} - killed.keys()
    assert set(exits) == survivors and set(exits.values()) == {0}, exits
    assert not touched, f"done rows updated: {touched[:5]}"
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    # The server keeps the cut-off host's connections from before the silence until it
    # next writes to them (or its own keepalives give up): the sampler counts them with
    # the worker's new ones. Its bounds hold for the others, and for the new ones.
    for maxima in (sampler.max_connections, sampler.max_listening):
        maxima.pop(cut.pid, None)
    sampler.check()
    new = cut_off["since_the_silence"]
    assert sum(new.values()) <= bound and new.get("listener", 0) <= 1, cut_off
    assert not problems, (
        f"{len(problems)} problems:\n"
        + "\n".join(problems[:30])
        + "\n"
        + explain(workers, troubled[:5], changes, ledger)
    )
    assert rescued["kill"] and rescued["partition"], "the faults caught no job"
    assert not unrefused, (
        f"the cut-off worker logged no refusal of {len(unrefused)} of {len(late)} late"
        f" outcomes (job: attempt): {dict(list(unrefused.items())[:10])}\n"
        + "\n".join(cut.stderr().splitlines()[-40:])
    )
    assert not misreported, f"done outcomes reported as leases lost: {misreported[:10]}"
    assert len(restarted["kill"]) == len(rescued["kill"]), figures
    # A lost job is back in the queue once its lease has expired and a reaper pass has
    # seen it; it starts again once the jobs queued before it have been claimed.
    assert max(rescued["kill"] + rescued["partition"]) < LEASE + REAP_INTERVAL + 3, figures


def late_outcomes(
    history: dict[int, list[Claim]], ledger: dict[int, list[Entry]], pid: int
) -> dict[int, int]:
    """The attempts that worker ``pid`` ran to their end after their job was claimed again
    (job: attempt): outcomes its fence must refuse."""
    late = {}
    for job_id, events in ledger.items():
        for e in events:
            claimed_again = any(c.attempt > e.attempt for c in history.get(job_id, []))
            if e.event == "end" and e.pid == pid and claimed_again:
                late[job_id] = e.attempt
    return late


def logged_lost(worker: WorkerProcess, why: str = "") -> set[tuple[int, int]]:
    """The leases ``worker`` logged as lost (for ``why`` only, when given): (job, attempt)."""
    pattern = rf"job (\d+): lease lost during attempt (\d+) \({re.escape(why)}"
    return {(int(job), int(attempt)) for job, attempt in re.findall(pattern, worker.stderr())}


def wait_refused(worker: WorkerProcess, late: dict[int, int], timeout: float) -> dict[int, int]:
    """Wait until ``worker`` has logged the refusal of each of the ``late`` outcomes;
    those it has not logged by ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        lost = logged_lost(worker)
        left = {job: attempt for job, attempt in late.items() if (job, attempt) not in lost}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def check_job(
    job_id: int,
    row: dict[str, Any],
    job_claims: list[Claim],
    events: list[Entry],
    killed: dict[int, float],
    claim_by: dict[int, float],
) -> list[str]:
    """What must hold for one job; each broken rule is a line. ``claim_by``: the workers
    that lost their leases, and the latest an attempt they claimed may be taken back."""
    problems = []
    final, final_pid = row["attempts"], row["pid"]
    if row["status"] != "done":
        return [f"job {job_id}: {row['status']}"]
    claimed = {c.attempt: c for c in job_claims}
    if [c.attempt for c in job_claims] != list(range(1, final + 1)):
        return [f"job {job_id}: claims {[c.attempt for c in job_claims]}, attempts {final}"]
    if job_claims[-1].pid != final_pid:
        problems.append(f"job {job_id}: last claim by {job_claims[-1].pid}, row says {final_pid}")
    for claim in job_claims[:-1]:
        if claim.pid not in claim_by or claim.at > claim_by[claim.pid]:
            problems.append(
                f"job {job_id}: attempt {claim.attempt} by {claim.pid}, a worker that kept"
                " its lease, yet the job was claimed again"
            )
    seen: Counter[tuple[str, int]] = Counter()
    for event in events:
        seen[event.event, event.attempt] += 1
        claimer = claimed.get(event.attempt)
        if claimer is None or claimer.pid != event.pid:
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
        problems.append(f"job {job_id}: done at {row['finished']}, before its end {final_ends}")
    return problems
