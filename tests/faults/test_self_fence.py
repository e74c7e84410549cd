"""The self-fence under a silent network partition: a worker that cannot renew its leases
stops its attempts before another worker may take the jobs back, so that no job runs on
two hosts at once.

Worker A runs in a network namespace of this file's own (`netns.Partition`, addresses of
10.252.0.0/16 and names of its own, apart from `test_partition.py`'s), worker B on the
host; the server is a `ControlledPostgres` listening on 127.0.0.1 and on the host's end
of the link. A holds three jobs of 12 s and one of 3 s, lease 6 s, when its link goes
silent (every packet dropped both ways). The ledger (outside the database) times every
start, end and cancellation:

- each long job's attempt on A is cancelled before B's rescuer lets B claim the job, and
  its `cancel` comes before B's `start`: the two runs of a job never overlap;
- the short job ends on A during the silence: its outcome waits for the database, so it
  is not stopped; B takes it back after its lease and runs it again (after A's run ended),
  and once the link is back A's late outcome is refused by the fence on the write;
- every job is done once, by B; no done row is written again; A does a new job within
  10 s of the link coming back. (Or within a lease more: a claim of A's sent in the
  silence and answered once the link is back, more than 0.8 of the lease later, may be
  the one that takes it. A cannot tell when the server ran that claim, so the fence
  gives the job up unrun, and it comes back after its lease.)
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from asyncq.worker.settings import FENCE_AFTER
from tests.faults.netns import Partition
from tests.faults.pgctl import ControlledPostgres
from tests.faults.support import (
    Db,
    claims,
    create_database,
    done_touched,
    fault_workers,
    jobs,
    not_done,
    record_figures,
)
from tests.harness.app import WORK
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Entry
from tests.harness.waiting import wait_until

LEASE = 6.0
LONG_MS, SHORT_MS = 12_000, 3_000
RECOVER_WITHIN = 10.0
SLACK = 1.0  # the fence's timer, on a busy 2-core machine
FENCED = re.compile(r"job (\d+) \(\S+\): lease not renewed for ([\d.]+)s: stopping attempt 1")


@pytest.fixture(scope="module")
def link() -> Iterator[Partition]:
    made = Partition.make(name="fence", second=252)
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


def overlaps(events: list[Entry]) -> list[str]:
    """Runs of one job that overlap in time: an attempt started before an earlier one
    (of any worker) ended or was cancelled."""
    found = []
    starts = sorted((e for e in events if e.event == "start"), key=lambda e: e.at)
    for i, first in enumerate(starts):
        ends = [e.at for e in events if e.event in ("end", "cancel") and e.attempt == first.attempt]
        ended = min(ends, default=float("inf"))  # never ended: still running
        for later in starts[i + 1 :]:
            if later.at < ended:
                found.append(
                    f"job {first.job_id}: attempt {later.attempt} started on pid {later.pid} at"
                    f" {later.at:.3f}, while attempt {first.attempt} on pid {first.pid} ran"
                    f" (from {first.at:.3f} to {ended:.3f})"
                )
    return found


def log_times(text: str, needle: str) -> list[float]:
    found = []
    for line in text.splitlines():
        if needle in line:
            found.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return found


@pytest.mark.timeout(180)
def test_a_cut_off_worker_stops_its_attempts_before_another_worker_takes_them(
    link: Partition,
    server: ControlledPostgres,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dsn = create_database(server, "self_fence", history=True)
    workers = fault_workers(dsn, tmp_path)
    inside = workers.env(ASYNCQ_DSN=server.dsn("self_fence", host=link.host_ip))
    try:
        with Db(dsn) as db:
            a = workers.start(
                "-q", "a_only", "-q", "part", lease=LEASE, env=inside, prefix=link.prefix()
            )
            held = insert_jobs(db.conn, WORK, [{"ms": LONG_MS} for _ in range(3)], queue="part")
            [short] = insert_jobs(db.conn, WORK, [{"ms": SHORT_MS}], queue="part")
            wait_until(
                lambda: all(workers.ledger.first_start(i) for i in [*held, short]), 10, "A's jobs"
            )
            b = workers.start("-q", "part", "-q", "default", lease=LEASE)
            time.sleep(1)  # a heartbeat before the silence
            silent_at = time.time()
            link.silence()
            try:
                wait_until(
                    lambda: all(workers.ledger.first_start(i, attempt=2) for i in [*held, short]),
                    30,
                    "B to start every job again",
                )
            finally:
                link.restore()
            back_at = time.time()
            [probe] = insert_jobs(db.conn, WORK, [{"ms": 0}], queue="a_only")
            wait_until(lambda: not_done(db, [probe]) == 0, 30, "the probe to be done")
            wait_until(lambda: not_done(db, [*held, short]) == 0, 30, "B to do A's jobs")
            refused = f"job {short}: lease lost during attempt 1 (before its outcome (done)"
            a.wait_log(refused, 30)
            exits = workers.stop_all()
            rows = jobs(db)
            history = claims(db)
            touched = done_touched(db)
        ledger = workers.ledger.by_job()
    finally:
        if link.silent:
            link.restore()
        workers.kill_all()

    fenced = {int(m[1]): float(m[2]) for m in FENCED.finditer(a.stderr())}
    margins = {}  # A's cancel to B's claim (the database's time), and to B's start
    for job_id in held:
        [cancel] = [e for e in ledger[job_id] if e.event == "cancel"] or [None]
        assert cancel is not None and cancel.pid == a.pid, ledger[job_id]
        b_start = workers.ledger.first_start(job_id, attempt=2)
        assert b_start is not None
        margins[job_id] = (
            round(history[job_id][1].at - cancel.at, 3),
            round(b_start.at - cancel.at, 3),
        )
    cancels = {i: next(e.at for e in ledger[i] if e.event == "cancel") for i in held}
    a_end = [e.at for e in ledger[short] if e.event == "end" and e.pid == a.pid]
    b_short = workers.ledger.first_start(short, attempt=2)
    probe_end = next(e.at for e in ledger[probe] if e.event == "end")
    figures = {
        "lease_s": LEASE,
        "silent_s": round(back_at - silent_at, 2),
        "fenced_after_silence_s": sorted(round(at - silent_at, 2) for at in cancels.values()),
        "unrenewed_when_fenced_s": sorted(fenced.values()),
        "cancel_to_b_claim_s": sorted(m[0] for m in margins.values()),
        "cancel_to_b_start_s": sorted(m[1] for m in margins.values()),
        "short_job_a_end_to_b_start_s": round(b_short.at - min(a_end), 2)
        if a_end and b_short
        else None,
        "short_job_outcome_refused_after_link_back_s": round(
            log_times(a.stderr(), refused)[0] - back_at, 2
        ),
        "probe_done_after_link_back_s": round(probe_end - back_at, 2),
        "probe_claim_answered_too_late": probe in fenced,
    }
    with capsys.disabled():
        print(record_figures("self_fence", figures))

    problems = [p for i in [*held, short] for p in overlaps(ledger[i])]
    assert not problems, "jobs ran on two hosts at once:\n" + "\n".join(problems)
    assert exits == {a.pid: 0, b.pid: 0}, exits
    assert not touched, touched
    assert not workers.tracebacks(), "\n".join(workers.tracebacks())
    # A stopped each long job itself, within FENCE_AFTER of a lease of its last renewal
    # (sent before the silence), and before B's claim, let alone B's start.
    assert sorted(set(fenced) - {probe}) == sorted(held), (fenced, a.stderr()[-3000:])
    for job_id in held:
        assert FENCE_AFTER * LEASE - 0.05 <= fenced[job_id] < FENCE_AFTER * LEASE + SLACK, fenced
        assert cancels[job_id] - silent_at < FENCE_AFTER * LEASE + SLACK, figures
        assert min(margins[job_id]) > 0, figures
        assert [(e.event, e.attempt, e.pid) for e in ledger[job_id]] == [
            ("start", 1, a.pid),
            ("cancel", 1, a.pid),
            ("start", 2, b.pid),
            ("end", 2, b.pid),
        ], ledger[job_id]
    # The short job ended on A in the silence, unstopped; B ran it again after that, and
    # A's outcome, written once the link was back, was refused.
    assert [(e.event, e.attempt, e.pid) for e in ledger[short]] == [
        ("start", 1, a.pid),
        ("end", 1, a.pid),
        ("start", 2, b.pid),
        ("end", 2, b.pid),
    ], ledger[short]
    assert short not in fenced
    for job_id in [*held, short]:
        row = rows[job_id]
        assert row["status"] == "done" and row["pid"] == b.pid, row
        assert [(c.attempt, c.pid) for c in history[job_id]] == [(1, a.pid), (2, b.pid)]
    recover_within = RECOVER_WITHIN
    if probe in fenced:  # given up at its claim, unrun; claimed again after its lease
        assert [c.pid for c in history[probe]] == [a.pid, a.pid], history[probe]
        assert [e.event for e in ledger[probe]] == ["start", "end"], ledger[probe]
        recover_within += LEASE
    assert probe_end - back_at < recover_within, figures
