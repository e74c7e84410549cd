"""What the fault suite adds to the harness (`tests.harness`): a database on the
controlled server with audit triggers, a sampler of ``pg_stat_activity``, a steady
stream of deferred jobs, and the figures files (the proxy that can hang is
`tests.harness.proxy`).

Everything here observes from outside: worker processes are real ``python -m asyncq
worker`` processes, the ledger is written by the tasks themselves, and the audit tables
are filled by triggers inside PostgreSQL, not by asyncq.
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.types.json import Jsonb

import asyncq
from tests.faults.pgctl import ControlledPostgres
from tests.harness.app import WORK
from tests.harness.app import app as harness_app
from tests.harness.ledger import Entry, Ledger
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until

# A worker's connections, from asyncq/app.py and asyncq/worker/supervisor.py: its App's
# pool (pool_max_size, grown to the concurrency + 2 when a worker runs; the suite's
# workers run at most 10 jobs at once), one LISTEN connection, the worker's own pool
# (its claim loops, at most two, and four more), and the connection of a look at a claim
# that has no answer (asyncq/worker/producer.py), for a moment.
MAX_CONCURRENCY = 10
LISTEN_CONNECTIONS = 1
WORKER_POOL_MAX = 2 + 4
LOOK_CONNECTIONS = 1
CONNECTIONS_PER_WORKER = (
    max(harness_app.pool_max_size, MAX_CONCURRENCY + 2)
    + LISTEN_CONNECTIONS
    + WORKER_POOL_MAX
    + LOOK_CONNECTIONS
)


def connection_bound(concurrency: int) -> int:
    """The most connections a worker process of the harness app running ``concurrency``
    jobs at once may have (`CONNECTIONS_PER_WORKER` is this for the suite's usual 10)."""
    app_pool = max(harness_app.pool_max_size, concurrency + 2)
    return app_pool + LISTEN_CONNECTIONS + WORKER_POOL_MAX + LOOK_CONNECTIONS


RESULTS = Path(__file__).parent / "results" / "last-run.json"
FIGURES = Path(__file__).parent / "results"  # one file per test

# -- the database -----------------------------------------------------------------------

# Any UPDATE of a row that is done: a transition out of done, or a done outcome written
# again. Nothing in asyncq may do either; the table must stay empty.
AUDIT = """
CREATE TABLE faults_done_touched (
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    id          bigint NOT NULL,
    old_status  text NOT NULL,
    new_status  text NOT NULL,
    old_attempts int NOT NULL,
    new_attempts int NOT NULL,
    locked_by   text
);
CREATE FUNCTION faults_done_touched() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO faults_done_touched (id, old_status, new_status, old_attempts, new_attempts,
                                     locked_by)
    VALUES (OLD.id, OLD.status, NEW.status, OLD.attempts, NEW.attempts, NEW.locked_by);
    RETURN NULL;
END
$$;
CREATE TRIGGER faults_done_touched AFTER UPDATE ON asyncq_jobs
    FOR EACH ROW WHEN (OLD.status = 'done')
    EXECUTE FUNCTION faults_done_touched();
"""

# Every change of status, with the attempt and the worker: the claims (-> running) name
# the process that took each attempt.
HISTORY = """
CREATE TABLE faults_history (
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    id          bigint NOT NULL,
    old_status  text NOT NULL,
    new_status  text NOT NULL,
    attempts    int NOT NULL,
    locked_by   text
);
CREATE FUNCTION faults_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO faults_history (id, old_status, new_status, attempts, locked_by)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts, NEW.locked_by);
    RETURN NULL;
END
$$;
CREATE TRIGGER faults_history AFTER UPDATE OF status ON asyncq_jobs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION faults_history();
"""


def create_database(server: ControlledPostgres, name: str, *, history: bool = False) -> str:
    """A new database on ``server``, migrated by asyncq, with the audit trigger (and, with
    ``history``, the status history). Returns its DSN."""
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = server.dsn(name)

    async def migrate() -> None:
        async with asyncq.App(dsn) as app:
            await app.migrate()

    anyio.run(migrate)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(AUDIT)
        if history:
            conn.execute(HISTORY)
    return dsn


def pid_of(worker_id: str | None) -> int | None:
    """The process id in a worker id (``host:pid:token``)."""
    if not worker_id:
        return None
    return int(worker_id.rsplit(":", 2)[1])


def done_touched(db: Db) -> list[tuple[Any, ...]]:
    return db.rows("SELECT * FROM faults_done_touched ORDER BY at")


@dataclass(frozen=True)
class Claim:
    """One attempt's claim, from the status history."""

    job_id: int
    attempt: int
    pid: int
    at: float


def claims(db: Db) -> dict[int, list[Claim]]:
    """Every claim of every job, in order, from ``faults_history``."""
    rows = db.rows(
        "SELECT id, attempts, locked_by, extract(epoch FROM at)::float8 FROM faults_history"
        " WHERE new_status = 'running' ORDER BY at"
    )
    found: dict[int, list[Claim]] = defaultdict(list)
    for job_id, attempt, locked_by, at in rows:
        pid = pid_of(locked_by)
        assert pid is not None, f"job {job_id} claimed by nobody"
        found[job_id].append(Claim(job_id, attempt, pid, at))
    return found


def transitions(db: Db) -> dict[int, list[tuple[Any, ...]]]:
    """Every change of status of every job, in order: (time, old, new, attempts, worker)."""
    rows = db.rows(
        "SELECT id, extract(epoch FROM at)::float8, old_status, new_status, attempts, locked_by"
        " FROM faults_history ORDER BY at"
    )
    found: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for job_id, *rest in rows:
        found[job_id].append(tuple(rest))
    return found


# -- worker processes ----------------------------------------------------------------------


def fault_workers(dsn: str, folder: Path, **env: str) -> Workers:
    """Workers of the harness app with the ledger and the logs in ``folder``."""
    return Workers(dsn, Ledger(folder / "ledger.txt"), folder / "logs", **env)


def log_lines(worker: WorkerProcess) -> list[tuple[float, str]]:
    """(unix time, message) of each line of a worker's log (the CLI's text format)."""
    found = []
    for line in worker.stderr().splitlines():
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        found.append((at, line[24:]))
    return found


def explain(
    workers: Workers,
    job_ids: Iterable[int],
    history: dict[int, list[tuple[Any, ...]]],
    ledger: dict[int, list[Entry]],
) -> str:
    """What the history, the ledger, the kills and the logs say of these jobs."""
    lines = []
    for job_id in job_ids:
        lines.append(f"job {job_id}:")
        lines += [f"  status {change}" for change in history.get(job_id, [])]
        lines += [f"  ledger {entry}" for entry in ledger.get(job_id, [])]
        pids = {e.pid for e in ledger.get(job_id, [])}
        pids |= {pid_of(c[-1]) for c in history.get(job_id, []) if c[-1]}  # type: ignore[misc]
        lines += [
            f"  killed {pid} at {workers.killed[pid]:.6f}" for pid in pids & workers.killed.keys()
        ]
        pattern = re.compile(rf"\bjob {job_id}\b")
        for worker in workers.started:
            lines += [
                f"  log {worker.pid}: {line}"
                for line in worker.stderr().splitlines()
                if pattern.search(line)
            ]
    return "\n".join(lines)


# -- the pg_stat_activity sampler -----------------------------------------------------------


def is_listener(application_name: str) -> bool:
    """A worker's LISTEN connection: asyncq names it ``<application_name>:<pid>:listener``."""
    return application_name.endswith(":listener")


# The LISTEN connection of the worker whose application_name (without the suffix) is %s.
LISTENER = """application_name = %s || ':listener'"""

ACTIVITY = """
SELECT application_name, state, query,
       extract(epoch FROM clock_timestamp() - state_change)::float8, host(client_addr)
  FROM pg_stat_activity
 WHERE application_name LIKE 'asyncq:%%' AND datname = %s AND backend_type = 'client backend'
"""


@dataclass
class Snapshot:
    at: float
    connections: dict[int, int]  # worker pid -> its server connections
    listening: dict[int, int]  # worker pid -> its connections whose query is LISTEN


@dataclass
class Sampler:
    """Polls ``pg_stat_activity`` every ``interval`` seconds in a thread, through the
    faults too (it reconnects): asyncq connections idle in a transaction for longer
    than ``idle_limit``, and each worker process's connections.

    A transaction idle after its BEGIN alone is counted apart: a worker whose link went
    silent between its BEGIN and its first statement (the one that bounds the
    transaction's idle time) leaves one. It holds no lock but its own, no snapshot and
    no transaction id: nothing (another worker, vacuum) waits on it.

    ``idle_limits`` gives some client addresses a limit of their own: a host whose link
    goes silent mid-transaction leaves it to the server, which ends it after asyncq's
    own bound (`asyncq.store.IDLE_LIMIT`)."""

    server_dsn: str
    dbname: str
    interval: float = 0.1
    idle_limit: float = 1.0
    idle_limits: dict[str, float] = field(default_factory=dict)  # client address -> limit
    bound: int = CONNECTIONS_PER_WORKER  # connections one worker process may have
    samples: int = 0
    idle_in_transaction: list[tuple[float, str, float, str]] = field(default_factory=list)
    idle_after_begin: list[tuple[float, str, float]] = field(default_factory=list)
    max_connections: dict[int, int] = field(default_factory=dict)
    max_listening: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last: Snapshot | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="pg_stat_activity sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def snapshot(self) -> Snapshot:
        """The connections of every worker process now (waits for a fresh sample)."""
        seen = self.samples
        wait_until(lambda: self.samples > seen + 1, 30, "a fresh pg_stat_activity sample")
        assert self._last is not None
        return self._last

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
            try:
                self._sample(rows)
            except Exception as exc:  # noqa: BLE001 - reported by check(), not lost with the thread
                self.errors.append(repr(exc))
        if conn is not None:
            conn.close()

    def _sample(self, rows: list[tuple[Any, ...]]) -> None:
        connections: dict[int, int] = defaultdict(int)
        listening: dict[int, int] = defaultdict(int)
        for application_name, state, query, idle_for, address in rows:
            pid = int(application_name.split(":")[1])
            connections[pid] += 1
            if is_listener(application_name):
                listening[pid] += 1
            limit = self.idle_limits.get(address, self.idle_limit)
            if (state or "").startswith("idle in transaction") and idle_for > limit:
                if (query or "").strip().upper() == "BEGIN":
                    self.idle_after_begin.append((time.time(), application_name, idle_for))
                else:
                    self.idle_in_transaction.append(
                        (time.time(), application_name, idle_for, query)
                    )
        for pid, n in connections.items():
            self.max_connections[pid] = max(n, self.max_connections.get(pid, 0))
        for pid, n in listening.items():
            self.max_listening[pid] = max(n, self.max_listening.get(pid, 0))
        self._last = Snapshot(time.time(), dict(connections), dict(listening))
        self.samples += 1

    def check(self) -> None:
        """The invariants over every sample taken."""
        assert not self.errors, f"the sampler failed: {self.errors[:3]}"
        assert self.samples > 10, "the sampler saw (almost) nothing"
        assert not self.idle_in_transaction, (
            f"asyncq connections idle in a transaction for more than {self.idle_limit}s"
            f"{f' ({self.idle_limits} by address)' if self.idle_limits else ''}:"
            f" {self.idle_in_transaction[:5]}"
        )
        over = {p: n for p, n in self.max_connections.items() if n > self.bound}
        assert not over, f"workers over {self.bound} connections: {over}"
        doubled = {p: n for p, n in self.max_listening.items() if n > LISTEN_CONNECTIONS}
        assert not doubled, f"workers with more than one LISTEN connection: {doubled}"

    def figures(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "idle_in_transaction_over_1s": len(self.idle_in_transaction),
            "idle_after_begin_alone_over_1s": len(self.idle_after_begin),
            "max_connections_per_worker": max(self.max_connections.values(), default=0),
            "connection_bound_per_worker": self.bound,
        }


# -- a steady stream of jobs ---------------------------------------------------------------

INSERT = """
INSERT INTO asyncq_jobs (task_name, args, max_attempts)
SELECT %(task)s, a, %(max_attempts)s FROM jsonb_array_elements(%(args)s) AS a
RETURNING id, (args->>'tag')::int
"""


class Deferrer:
    """Defers ``per_tick`` jobs every ``tick`` seconds with plain SQL (one autocommit
    INSERT each time), through the faults: it remembers which jobs it saw committed,
    and which INSERTs failed with an unknown outcome (sent, then the connection broke)."""

    def __init__(
        self,
        dsn: str,
        *,
        per_tick: int,
        tick: float,
        ms: Callable[[random.Random], int],
        max_attempts: int,
        seed: int,
    ) -> None:
        self.dsn = dsn
        self.per_tick = per_tick
        self.tick = tick
        self.ms = ms
        self.max_attempts = max_attempts
        self.rng = random.Random(seed)
        self.committed: dict[int, int] = {}  # tag -> job id
        self.committed_at: dict[int, float] = {}  # tag -> time.time() the commit was seen
        self.uncertain: set[int] = set()
        self.refused = 0  # INSERTs that could not be sent at all
        self._next_tag = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deferrer")

    def __enter__(self) -> Deferrer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += self.tick
            tags = list(range(self._next_tag, self._next_tag + self.per_tick))
            self._next_tag += self.per_tick
            args = [{"ms": self.ms(self.rng), "tag": tag} for tag in tags]
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
            except psycopg.Error:
                self.refused += 1
            else:
                try:
                    rows = conn.execute(
                        INSERT,
                        {"task": WORK, "args": Jsonb(args), "max_attempts": self.max_attempts},
                    ).fetchall()
                except psycopg.Error:
                    self.uncertain.update(tags)
                    conn.close()
                    conn = None
                else:
                    now = time.time()
                    for job_id, tag in rows:
                        self.committed[tag] = job_id
                        self.committed_at[tag] = now
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        if conn is not None:
            conn.close()


# -- checks and figures ---------------------------------------------------------------------


class Db:
    """The test's own autocommit connection, opened again after a fault broke it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def __enter__(self) -> Db:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
        return self._conn

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        try:
            return self.conn.execute(sql, params or None).fetchall()
        except psycopg.OperationalError:
            self.close()  # broken by a fault: once more, on a new connection
            return self.conn.execute(sql, params or None).fetchall()

    def value(self, sql: str, *params: Any) -> Any:
        return self.rows(sql, *params)[0][0]


def jobs(db: Db) -> dict[int, dict[str, Any]]:
    """Every job row by id, with the columns the checks use."""
    rows = db.rows(
        "SELECT id, status::text, attempts, locked_by, extract(epoch FROM finished_at)::float8,"
        " (args->>'tag')::int FROM asyncq_jobs"
    )
    return {
        r[0]: {"status": r[1], "attempts": r[2], "pid": pid_of(r[3]), "finished": r[4], "tag": r[5]}
        for r in rows
    }


def not_done(db: Db, ids: Iterable[int]) -> int:
    return int(
        db.value(
            "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND status <> 'done'", list(ids)
        )
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_s": round(statistics.median(values), 3),
        "p90_s": round(percentile(values, 0.9), 3),
        "max_s": round(max(values), 3),
    }


def record_figures(test: str, figures: dict[str, Any]) -> str:
    """Merge one test's figures into ``results/last-run.json``; returns them as text."""
    RESULTS.parent.mkdir(exist_ok=True)
    try:
        everything = json.loads(RESULTS.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        everything = {}
    figures = {"recorded_at": time.strftime("%Y-%m-%d %H:%M:%S"), **figures}
    everything[test] = figures
    RESULTS.write_text(json.dumps(everything, indent=2, sort_keys=True) + "\n")
    return f"\n[{test}] " + json.dumps(figures, indent=2, sort_keys=True)


def proc_status(pid: int) -> dict[str, int]:
    """A process's resident memory (kB) and open file descriptors, from /proc."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    assert match, text
    return {"rss_kb": int(match[1]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


# -- waiting, processes, the database clock ---------------------------------------------


def wait_started(ledger: Ledger, job_id: int, timeout: float, attempt: int | None = None) -> Entry:
    return wait_until(
        lambda: ledger.first_start(job_id, attempt), timeout, f"job {job_id} to start"
    )


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat: T when stopped, Z when dead."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def db_now(db: psycopg.Connection[Any]) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


# -- figures ----------------------------------------------------------------------------


@pytest.fixture
def figures(capsys: pytest.CaptureFixture[str]) -> Callable[[str, dict[str, Any]], None]:
    """``figures(name, values)``: writes results/<name>.json and prints it."""

    def save(name: str, values: dict[str, Any]) -> None:
        FIGURES.mkdir(exist_ok=True)
        document = {"test": name, "measured_at": datetime.now(UTC).isoformat(), **values}
        text = json.dumps(document, indent=2, ensure_ascii=False)
        (FIGURES / f"{name}.json").write_text(text + "\n")
        with capsys.disabled():
            print(f"\n[faults figures] {name}: {json.dumps(values)}")

    return save
