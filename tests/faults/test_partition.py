"""Silent network partitions: every connection of a worker goes dead at once, without a
word (`netns.Partition`: the worker runs in a network namespace of the test's own, whose
link to the host drops every packet both ways).

The server is a `ControlledPostgres` listening on 127.0.0.1 and on the host's end of the
link. Worker A runs inside the namespace, worker B on the host; A alone serves the
queue ``a_only``, where the test puts the jobs it wants A to hold and the probe it
defers once the link is back. Two partitions:

- shorter than the lease (10 s, lease 30 s): A's connections die (the kernel gives them
  up after 6 s) and A logs the failures; once the link is back it renews its leases in
  time and finishes the jobs it held; nobody else runs them. Calls in flight on a
  connection the kernel had not given up yet simply end when the link is back.
- longer than the lease (25 s, lease 6 s): no call of A waits past its deadline (its
  log shows a failed claim at least every deadline plus a poll and the longest backoff,
  a failed heartbeat at least every two heartbeat intervals); A stops the jobs it held
  (its self-fence, `test_self_fence.py`) before B's rescuer takes them back and B does
  them. An
  App inside the namespace defers and waits for results through it: its idle
  connection is given up within the TCP user timeout, and no defer outlives its
  deadline.

In both, A claims and finishes a new job within 10 s of the link coming back, every
job is done once (the audit trigger: no done row written again), and no traceback.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncq.pools import DEADLINE, TCP_DEFAULTS
from asyncq.transient import backoff_delay
from tests.faults.netns import Partition
from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import (
    Db,
    claims,
    create_database,
    done_touched,
    fault_workers,
    jobs,
    log_lines,
    not_done,
    record_figures,
)
from tests.harness.app import WORK
from tests.harness.jobs import insert_jobs
from tests.harness.processes import REPO, WorkerProcess
from tests.harness.waiting import wait_until

# The kernel gives a silent peer up after this long (TCP_DEFAULTS), idle or busy.
TCP_GIVES_UP = TCP_DEFAULTS["tcp_user_timeout"] / 1000
BACKOFF_CAP = backoff_delay.__kwdefaults__["cap"]  # type: ignore[index]
RECOVER_WITHIN = 10.0
SLACK = 3.0  # a busy 2-core machine


@pytest.fixture(scope="module")
def link() -> Iterator[Partition]:
    made = Partition.make()
    try:
        yield made
    finally:
        made.destroy()


@pytest.fixture(scope="module")
def server(link: Partition) -> Iterator[ControlledPostgres]:
    pg = ControlledPostgres()
    try:
        pg.init(also_on=link.host_ip, trusting=link.network)
        pg.start()
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def silence(link: Partition) -> Iterator[Partition]:
    try:
        yield link
    finally:
        if link.silent:
            link.restore()


def failures(worker: WorkerProcess, what: str, since: float, until: float) -> list[float]:
    """When the worker logged ``what`` (a service's failure) between the two times."""
    return [at for at, text in log_lines(worker) if what in text and since <= at <= until]


def longest_gap(times: list[float], since: float, until: float) -> float:
    points = [since, *sorted(times), until]
    return max(b - a for a, b in itertools.pairwise(points))


def every_service_kept_trying(
    worker: WorkerProcess, silent_at: float, back_at: float, heartbeat: float, held_until: float
) -> dict[str, Any]:
    """The claim loop and the heartbeat logged failure after failure while the link was
    silent (the heartbeat, while the worker held jobs to renew): none of their calls
    waited past its deadline. Their longest silences."""
    claim_bound = 1 + DEADLINE + BACKOFF_CAP + SLACK  # a poll, a call, a backoff
    heartbeat_bound = 2 * heartbeat + SLACK  # a turn, and a call cut at its interval
    found = {}
    for what, bound, until in (
        ("claim failed", claim_bound, back_at),
        ("heartbeat failed", heartbeat_bound, min(back_at, held_until)),
    ):
        times = failures(worker, what, silent_at, until)
        gap = longest_gap(times, silent_at, until)
        assert times and gap < bound, (what, gap, bound, times, worker.stderr()[-3000:])
        found[what] = {"logged": len(times), "longest_gap_s": round(gap, 2)}
    return found


def ended(ledger_by_job: dict[int, list[Any]], job_id: int) -> float | None:
    ends = [e.at for e in ledger_by_job.get(job_id, []) if e.event == "end"]
    return min(ends) if ends else None


@pytest.mark.timeout(240)
def test_a_partition_shorter_than_the_lease(
    link: Partition,
    silence: Partition,
    server: ControlledPostgres,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lease, outage = 30.0, 10.0
    dsn = create_database(server, "short_partition", history=True)
    workers = fault_workers(dsn, tmp_path)
    inside = server.dsn("short_partition", host=link.host_ip)
    try:
        with Db(dsn) as db:
            a = workers.start(
                "-q",
                "a_only",
                lease=lease,
                env=workers.env(ASYNCQ_DSN=inside),
                prefix=link.prefix(),
            )
            b = workers.start("-q", "part", "-q", "default", lease=lease)
            held = insert_jobs(
                db.conn,
                WORK,
                [{"ms": ms} for ms in (3000, 6000, 14000, 16000)],
                queue="a_only",
            )
            wait_until(lambda: all(workers.ledger.first_start(i) for i in held), 10, "A's jobs")
            time.sleep(1)  # a heartbeat or two before the silence
            silent_at = time.time()
            silence.silence()
            time.sleep(outage)
            silence.restore()
            back_at = time.time()
            [probe] = insert_jobs(db.conn, WORK, [{"ms": 0}], queue="a_only")
            wait_until(lambda: not_done(db, [probe]) == 0, 60, "the probe to be done")
            wait_until(lambda: not_done(db, held) == 0, 60, "A's jobs to be done")
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        workers.kill_all()

    # Calls in flight when the link came back, on connections the kernel had not given up
    # yet, end then: only the failures of the calls that were given up are logged.
    noticed = {
        what: len(failures(a, what, silent_at, back_at + 1))
        for what in ("claim failed", "listener connection lost", "heartbeat failed")
    }
    probe_end = ended(ledger, probe)
    assert probe_end is not None
    figures = {
        "lease_s": lease,
        "silent_s": round(back_at - silent_at, 2),
        "failures_logged_while_silent": noticed,
        "probe_done_after_link_back_s": round(probe_end - back_at, 2),
        "held_jobs_done_by": sorted({rows[i]["pid"] for i in held}),
    }
    with capsys.disabled():
        print(record_figures("partition_shorter_than_lease", figures))
    assert exits == {a.pid: 0, b.pid: 0}, exits
    assert not touched, touched
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    assert noticed["claim failed"] and noticed["listener connection lost"], figures
    assert probe_end - back_at < RECOVER_WITHIN, figures
    for job_id in held:  # A kept its leases and finished its jobs; nobody else ran them
        assert rows[job_id]["status"] == "done" and rows[job_id]["pid"] == a.pid, rows[job_id]
        assert [c.attempt for c in history[job_id]] == [1], history[job_id]
        assert [(e.event, e.pid) for e in ledger[job_id]] == [("start", a.pid), ("end", a.pid)]


@pytest.mark.timeout(300)
def test_a_partition_longer_than_the_lease(
    link: Partition,
    silence: Partition,
    server: ControlledPostgres,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lease, outage = 6.0, 25.0
    dsn = create_database(server, "long_partition", history=True)
    workers = fault_workers(dsn, tmp_path)
    inside = workers.env(ASYNCQ_DSN=server.dsn("long_partition", host=link.host_ip))
    client_out = tmp_path / "client.jsonl"
    client: subprocess.Popen[bytes] | None = None
    try:
        with Db(dsn) as db:
            a = workers.start(
                "-q", "a_only", "-q", "part", lease=lease, env=inside, prefix=link.prefix()
            )
            held = insert_jobs(db.conn, WORK, [{"ms": 20000} for _ in range(3)], queue="part")
            wait_until(lambda: all(workers.ledger.first_start(i) for i in held), 10, "A's jobs")
            b = workers.start("-q", "part", "-q", "default", lease=lease)
            with client_out.open("wb") as out:
                client = subprocess.Popen(
                    [*link.prefix(), sys.executable, "-m", "tests.faults.partition_client"],
                    env=inside,
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            wait_until(lambda: results(client_out, "result", ok=True), 20, "a first result")
            silent_at = time.time()
            silence.silence()
            time.sleep(outage)
            silence.restore()
            back_at = time.time()
            [probe] = insert_jobs(db.conn, WORK, [{"ms": 0}], queue="a_only")
            wait_until(lambda: not_done(db, [probe]) == 0, 60, "the probe to be done")
            wait_until(lambda: not_done(db, held) == 0, 60, "A's jobs to be done elsewhere")
            wait_until(
                lambda: [at for at in results(client_out, "result", ok=True) if at > back_at],
                30,
                "a result after the link is back",
            )
            wait_until(
                lambda: all(f"job {i} ({WORK}): lease not renewed" in a.stderr() for i in held),
                30,
                "A to stop the jobs it could not renew",
            )
            client.send_signal(signal.SIGTERM)
            client.wait(30)
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        workers.kill_all()

    # A renews nothing once its self-fence has given up the jobs it held.
    held_until = max(failures(a, "lease not renewed", silent_at, back_at), default=back_at)
    kept_trying = every_service_kept_trying(a, silent_at, back_at, lease / 4, held_until)
    probe_end = ended(ledger, probe)
    assert probe_end is not None
    events = [json.loads(line) for line in client_out.read_text().splitlines() if line[:1] == "{"]
    calls = [e for e in events if e["event"] in ("defer", "result")]
    during = [e for e in calls if silent_at < e["began"] < back_at]
    idle_dead = [e["ended"] for e in events if e["event"] == "idle_dead"]
    deferred_again = [e["ended"] for e in calls if e["event"] == "defer" and e["ok"]]
    deferred_again = [at for at in deferred_again if at > back_at]
    answered_again = [at for at in results(client_out, "result", ok=True) if at > back_at]
    figures = {
        "lease_s": lease,
        "silent_s": round(back_at - silent_at, 2),
        "while_silent": kept_trying,
        "probe_done_after_link_back_s": round(probe_end - back_at, 2),
        "probe_claim_answered_too_late": f"job {probe} ({WORK}): lease not renewed" in a.stderr(),
        "held_jobs": {i: [(c.attempt, c.pid) for c in history[i]] for i in held},
        "app_idle_connection_dead_after_s": [round(at - silent_at, 2) for at in idle_dead],
        "app_calls_begun_while_silent": len(during),
        "app_longest_failed_call_while_silent_s": round(
            max((e["ended"] - e["began"] for e in during if not e["ok"]), default=0), 2
        ),
        "app_defer_ok_after_link_back_s": round(min(deferred_again) - back_at, 2),
        "app_result_after_link_back_s": round(min(answered_again) - back_at, 2),
    }
    with capsys.disabled():
        print(record_figures("partition_longer_than_lease", figures))
    assert exits == {a.pid: 0, b.pid: 0}, exits
    assert client.returncode == 0, client_out.read_text()[-3000:]
    assert not touched, touched
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    # A claim of A's sent in the silence and answered once the link was back, more than 0.8
    # of the lease later, may be the one that took the probe: A cannot tell when the server
    # ran it, so its self-fence gave the probe up unrun, and it came back after its lease.
    late_claim = f"job {probe} ({WORK}): lease not renewed" in a.stderr()
    assert probe_end - back_at < RECOVER_WITHIN + (lease if late_claim else 0), figures
    for job_id in held:  # stopped by A, then taken back by B's reaper and done by B, once
        row = rows[job_id]
        assert row["status"] == "done" and row["pid"] == b.pid, row
        assert [(c.attempt, c.pid) for c in history[job_id]] == [(1, a.pid), (2, b.pid)]
        assert [(e.event, e.attempt, e.pid) for e in ledger[job_id]] == [
            ("start", 1, a.pid),
            ("cancel", 1, a.pid),
            ("start", 2, b.pid),
            ("end", 2, b.pid),
        ], ledger[job_id]
    # The App's idle connection was given up by the kernel within its TCP options ...
    assert idle_dead and idle_dead[0] - silent_at < TCP_GIVES_UP + SLACK, figures
    # ... none of its calls begun in the silence waited past its deadline ...
    assert during, "the App made no call while the link was silent"
    for call in during:
        if not call["ok"] or call["event"] == "defer":
            assert call["ended"] - call["began"] < DEADLINE + SLACK, call
    # ... and it deferred and had an answer again within seconds of the link's return.
    assert min(deferred_again) - back_at < RECOVER_WITHIN, figures
    assert min(answered_again) - back_at < RECOVER_WITHIN, figures


def results(path: Path, event: str, *, ok: bool) -> list[float]:
    """When the client logged ``event`` with that outcome."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        if line[:1] != "{":
            continue
        item = json.loads(line)
        if item["event"] == event and item.get("ok") == ok:
            found.append(item["ended"])
    return found
