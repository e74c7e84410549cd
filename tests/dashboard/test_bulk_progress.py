"""A large bulk action from a real ``asyncq dashboard`` process: the confirmation answers
at once while a task of the process runs the batches, its audit record counts the rows
as each batch commits (the count rises across reads and ends at the total), and a
dashboard killed mid-action leaves a record shown interrupted whose count is exactly
the jobs changed: whole batches, the lowest ids first, none half-changed; one stopped
(SIGTERM) writes its record stopped as it exits."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import httpx
import psycopg

from asyncq import admin
from tests.dashboard.conftest import Serve, csrf_token, needs_the_extra
from tests.harness.processes import WorkerProcess
from tests.harness.waiting import wait_until

needs_the_extra()

JOBS = 10_000  # 20 batches of admin.BULK_BATCH


def failed_jobs(db: psycopg.Connection[Any], n: int) -> list[int]:
    rows = db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue, args, status, finished_at, last_error)"
        " SELECT 'bulk.big', 'big', jsonb_build_object('n', i), 'failed', now(), 'boom'"
        "   FROM generate_series(1, %s) AS i RETURNING id",
        (n,),
    ).fetchall()
    return sorted(r[0] for r in rows)


def start_requeue(url: str) -> int:
    """Preview a requeue of the failed jobs of queue big, confirm it; the audit record's
    id from the answer's redirect."""
    page = httpx.get(f"{url}/jobs", params={"queue": "big", "status": "failed"})
    assert page.status_code == 200, page.text
    cookie = {"cookie": f"asyncq_csrf={page.cookies['asyncq_csrf']}"}
    form = {"csrf": csrf_token(page.text), "action": "requeue", "queue": "big", "status": "failed"}
    shown = httpx.post(f"{url}/jobs/bulk/preview", data=form, headers=cookie)
    assert shown.status_code == 200, shown.text
    confirm = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', shown.text))
    started = httpx.post(f"{url}/jobs/bulk/run", data=confirm, headers=cookie, timeout=30)
    assert started.status_code == 303, started.text
    found = re.fullmatch(r"/audit\?notice=bulk-started&record=(\d+)", started.headers["location"])
    assert found, started.headers["location"]
    return int(found[1])


def record(db: psycopg.Connection[Any], audit_id: int) -> tuple[str, int, int]:
    row = db.execute(
        "SELECT state, rows, matched FROM asyncq_audit WHERE id = %s", (audit_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def requeued(db: psycopg.Connection[Any]) -> list[int]:
    rows = db.execute("SELECT id FROM asyncq_jobs WHERE status = 'queued' ORDER BY id")
    return [r[0] for r in rows]


def audit_row(url: str, audit_id: int) -> str:
    page = httpx.get(f"{url}/audit")
    assert page.status_code == 200, page.text
    found = re.search(rf'<tr id="audit-{audit_id}".*?</tr>', page.text, re.S)
    assert found, page.text
    return found[0]


def test_a_large_bulk_action_runs_in_the_background_and_counts_its_rows_as_it_goes(
    serve: Serve, db: psycopg.Connection[Any]
) -> None:
    ids = failed_jobs(db, JOBS)
    url = serve()
    audit_id = start_requeue(url)
    # The answer came while the action had batches to go.
    state, rows, matched = record(db, audit_id)
    assert state == "running" and rows < JOBS and matched == JOBS
    seen = [rows]
    shown = ""
    while record(db, audit_id)[0] == "running":
        seen.append(record(db, audit_id)[1])
        if not shown and 0 < seen[-1] < JOBS:
            shown = audit_row(url, audit_id)
        time.sleep(0.05)
    assert record(db, audit_id) == ("done", JOBS, JOBS)
    assert seen == sorted(seen)
    counts_while_running = {n for n in seen if 0 < n < JOBS}
    assert len(counts_while_running) >= 2, seen
    assert all(n % admin.BULK_BATCH == 0 for n in counts_while_running), seen
    assert " running</td>" in shown and 'class="meter"' in shown
    finished = audit_row(url, audit_id)
    assert f'<td class="num">{JOBS}</td>' in finished and ">done</td>" in finished
    assert requeued(db) == ids


def test_a_dashboard_killed_mid_action_leaves_an_interrupted_record_of_whole_batches(
    serve: Serve, dashboards: list[WorkerProcess], db: psycopg.Connection[Any]
) -> None:
    ids = failed_jobs(db, JOBS)
    url = serve()
    audit_id = start_requeue(url)
    wait_until(
        lambda: record(db, audit_id)[1] >= 2 * admin.BULK_BATCH,
        30,
        "the action to commit two batches",
    )
    os.kill(dashboards[0].pid, signal.SIGKILL)
    dashboards[0].popen.wait(10)
    state, rows, _ = record(db, audit_id)
    assert state == "running" and 0 < rows < JOBS, (state, rows)
    # Whole batches in id order, and the record counts exactly the jobs they changed.
    assert rows % admin.BULK_BATCH == 0
    assert requeued(db) == ids[:rows]
    assert db.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'failed'").fetchone() == (
        JOBS - rows,
    )
    # No process moves the record any more: once it has been still for BULK_STALE, the
    # Audit page (of another dashboard) says the action was interrupted.
    again = serve()

    def shown_interrupted() -> str | None:
        row = audit_row(again, audit_id)
        return row if ">interrupted" in row else None

    interrupted = wait_until(
        shown_interrupted, admin.BULK_STALE.total_seconds() + 30, "the record to show interrupted"
    )
    assert f'<td class="num">{rows}</td>' in interrupted and "last seen" in interrupted
    assert record(db, audit_id) == ("running", rows, JOBS)


def test_a_dashboard_stopped_mid_action_writes_its_record_stopped_at_a_whole_batch(
    serve: Serve, dashboards: list[WorkerProcess], db: psycopg.Connection[Any]
) -> None:
    ids = failed_jobs(db, JOBS)
    url = serve()
    audit_id = start_requeue(url)
    wait_until(
        lambda: record(db, audit_id)[1] >= 2 * admin.BULK_BATCH,
        30,
        "the action to commit two batches",
    )
    dashboards[0].send(signal.SIGTERM)
    dashboards[0].wait(30)
    # Written as it stopped: the batch under way rolled back, the record counts the rest.
    state, rows, _ = record(db, audit_id)
    assert state == "stopped" and 0 < rows < JOBS, (state, rows)
    assert rows % admin.BULK_BATCH == 0
    assert requeued(db) == ids[:rows]
    assert ">stopped</td>" in audit_row(serve(), audit_id)
