"""The jobs list's filters, and bulk actions on what they find: the preview's counts, the
action's effect read back from the table, its audit record, and the refusals (no CSRF
token, read-only, a form that was never previewed)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import psycopg
import pytest

import asyncq
from tests.dashboard.conftest import Job, client_for, csrf_token, needs_the_extra

needs_the_extra()
pytestmark = pytest.mark.anyio


def listed(html: str) -> list[int]:
    return sorted(int(i) for i in re.findall(r'<td class="num"><a href="/jobs/(\d+)">', html))


async def test_the_jobs_list_filters_by_each_field(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any]
) -> None:
    mail = job("mail.send", queue="mail", args='{"to": "Ada@Example.com"}')
    digest = job("mail.digest", queue="mail", status="failed", error="boom")
    report = job("reports.daily", queue="reports", status="done", args='{"day": "monday"}')
    old = job("mail.send", queue="mail", status="done", args='{"to": "old@example.com"}')
    running = job("reports.daily", queue="reports", status="running")
    db.execute("UPDATE asyncq_jobs SET created_at = '2026-01-01 10:00+00' WHERE id = %s", (old,))

    async def found(**query: str) -> list[int]:
        page = await client.get("/jobs", params=query)
        assert page.status_code == 200, page.text
        return listed(page.text)

    assert await found(id=str(digest)) == [digest]
    assert await found(task="mail.") == sorted([mail, digest, old])
    assert await found(task="mail.send") == sorted([mail, old])
    assert await found(queue="reports") == sorted([report, running])
    assert await found(status="failed") == [digest]
    assert await found(queue="mail", status="done") == [old]
    assert await found(text="ada@example") == [mail]  # any case
    assert await found(text="monday", queue="mail") == []
    assert await found(worker="w1") == [running]
    assert old not in await found(window="1h")
    assert await found(window="1h", task="mail.send") == [mail]
    assert await found(**{"from": "2025-12-31", "to": "2026-01-02"}) == [old]
    assert await found(**{"to": "2026-01-01T11:00+01:00"}) == []  # 10:00 UTC, not before
    assert old in await found(**{"to": "2026-01-01T11:00:01+01:00"})
    page = (await client.get("/jobs", params={"queue": "mail", "task": "mail."})).text
    assert "<title>Queue mail · mail. · Jobs · asyncq</title>" in page
    assert "3 of 3 shown" in page
    # The status tabs keep the other filters.
    assert 'href="/jobs?queue=mail&amp;task=mail.&amp;status=failed"' in page


async def preview(
    client: httpx.AsyncClient, action: str, **fields: str
) -> tuple[httpx.Response, dict[str, str]]:
    """The jobs page of a filter, then its bulk preview; the preview and its confirm form."""
    page = await client.get("/jobs", params={k: v for k, v in fields.items() if k != "extra"})
    form = {"csrf": csrf_token(page.text), "action": action, **fields}
    shown = await client.post("/jobs/bulk/preview", data=form)
    assert shown.status_code == 200, shown.text
    confirm = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', shown.text))
    return shown, confirm


async def run(
    client: httpx.AsyncClient, confirm: dict[str, str], db: psycopg.Connection[Any]
) -> httpx.Response:
    """Confirm a bulk action, then wait for the dashboard's task to end it (the answer
    comes at once, while it runs)."""
    started = await client.post("/jobs/bulk/run", data=confirm)
    assert started.status_code == 303, started.text
    record = int(started.headers["location"].rsplit("record=", 1)[1])
    deadline = time.monotonic() + 30
    while db.execute("SELECT state FROM asyncq_audit WHERE id = %s", (record,)).fetchone() == (
        "running",
    ):
        assert time.monotonic() < deadline, f"bulk action {record} still running"
        await asyncio.sleep(0.02)
    return started


def count(html: str, what: str) -> int:
    found = re.search(rf'id="{what}">(\d+)', html)
    assert found, what
    return int(found[1])


async def test_a_bulk_requeue_previews_counts_runs_and_is_audited(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any]
) -> None:
    failed = [job("mail.send", queue="mail", status="failed", error="smtp") for _ in range(7)]
    job("mail.send", queue="mail", status="done")
    other = job("mail.send", queue="other", status="failed")
    shown, confirm = await preview(client, "requeue", queue="mail")
    assert count(shown.text, "would-change") == 5 + 2
    assert re.search(r"<strong>8</strong> jobs match", shown.text)
    assert confirm["up_to"] == str(other) and confirm["action"] == "requeue"
    assert all(status(db, i) == "failed" for i in failed)  # a preview changes nothing
    later = job("mail.send", queue="mail", status="failed")  # after the preview: left alone

    done = await run(client, confirm, db)
    assert done.headers["location"].startswith("/audit?notice=bulk-started&record=")
    assert [status(db, i) for i in failed] == ["queued"] * 7
    assert status(db, other) == "failed" and status(db, later) == "failed"
    row = db.execute(
        "SELECT actor, action, filter, detail, rows, matched, state, error,"
        "       at > now() - interval '1 min'"
        " FROM asyncq_audit"
    ).fetchall()
    assert row == [
        ("local", "requeue", {"queue": "mail", "up_to": other}, None, 7, 7, "done", None, True)
    ]
    audit = await client.get(done.headers["location"])
    assert "the bulk action runs" in audit.text
    assert re.search(r'<tr id="audit-1" class="marked">', audit.text)
    assert "queue=mail, up_to=" in audit.text and ">local<" in audit.text
    assert '<td class="audit-state state-done">done</td>' in audit.text


async def test_bulk_cancel_delete_priority_and_move(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any]
) -> None:
    queued = [job("t.a", queue="q") for _ in range(3)]
    running = job("t.a", queue="q", status="running")
    done = job("t.a", queue="q", status="done")

    _, confirm = await preview(client, "priority", queue="q", priority="9")
    await run(client, confirm, db)
    assert [prio(db, i) for i in queued] == [9, 9, 9]
    assert prio(db, running) == 0 and prio(db, done) == 0

    shown, confirm = await preview(client, "move", queue="q", to_queue="elsewhere")
    assert count(shown.text, "would-change") == 3
    await run(client, confirm, db)
    assert [queue_of(db, i) for i in queued] == ["elsewhere"] * 3
    assert queue_of(db, running) == "q" and queue_of(db, done) == "q"

    shown, confirm = await preview(client, "cancel", task="t.")
    assert count(shown.text, "would-change") == 4  # 3 queued, 1 running
    await run(client, confirm, db)
    assert [status(db, i) for i in queued] == ["cancelled"] * 3
    assert status(db, running) == "running"  # its worker is told, and ends it cancelled
    assert db.execute(
        "SELECT abort_requested_at IS NOT NULL FROM asyncq_jobs WHERE id = %s", (running,)
    ).fetchone() == (True,)

    shown, confirm = await preview(client, "delete", task="t.a")
    assert count(shown.text, "would-change") == 4  # 3 cancelled, 1 done
    await run(client, confirm, db)
    left = [r[0] for r in db.execute("SELECT id FROM asyncq_jobs ORDER BY id")]
    assert left == [running]
    audited = db.execute("SELECT action, detail, rows FROM asyncq_audit ORDER BY id").fetchall()
    assert audited == [
        ("priority", {"priority": 9}, 3),
        ("move", {"queue": "elsewhere"}, 3),
        ("cancel", None, 4),
        ("delete", None, 4),
    ]


async def test_a_bulk_action_runs_in_batches_past_the_first(
    app: asyncq.App, job: Job, db: psycopg.Connection[Any]
) -> None:
    from asyncq import admin, pools

    ids = [job("t", status="failed") for _ in range(25)]
    seen: list[int] = []
    result = await admin.bulk(
        lambda: pools.connection(app.pool),
        app.store,
        "requeue",
        admin.JobFilter(task="t", up_to=ids[-1]),
        actor="ops",
        batch=10,
        progress=seen.append,
    )
    assert (result.changed, result.batches) == (25, 3)
    assert seen == [10, 20, 25]
    assert [status(db, i) for i in ids] == ["queued"] * 25


async def test_a_bulk_preview_on_a_table_without_jobs_has_nothing_to_do(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any]
) -> None:
    job(status="failed")
    page = await client.get("/jobs", params={"status": "failed"})
    db.execute("DELETE FROM asyncq_jobs")  # pruned between the list and its preview
    form = {"csrf": csrf_token(page.text), "action": "requeue", "status": "failed"}
    shown = await client.post("/jobs/bulk/preview", data=form)
    assert shown.status_code == 200, shown.text
    confirm = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', shown.text))
    assert count(shown.text, "would-change") == 0
    assert "Nothing to do" in shown.text and "bulk-confirm" not in shown.text
    assert "up_to" not in confirm
    assert db.execute("SELECT count(*) FROM asyncq_audit").fetchone() == (0,)


async def test_a_bulk_post_without_its_token_or_preview_is_refused(
    client: httpx.AsyncClient, app: asyncq.App, job: Job, db: psycopg.Connection[Any]
) -> None:
    from asyncq.dashboard import create_app

    failed = job(status="failed")
    _, confirm = await preview(client, "requeue", status="failed")
    for path in ("/jobs/bulk/preview", "/jobs/bulk/run"):
        for token in ("", "0" * 64):
            refused = await client.post(path, data={**confirm, "csrf": token})
            assert refused.status_code == 403, (path, token)
            assert "form token" in refused.text
    unpreviewed = {k: v for k, v in confirm.items() if k != "up_to"}
    refused = await client.post("/jobs/bulk/run", data=unpreviewed)
    assert refused.status_code == 400 and "preview it first" in refused.text
    for bad in ({"action": "drop"}, {"action": "priority", "priority": "high"}):
        refused = await client.post("/jobs/bulk/preview", data={**confirm, **bad})
        assert refused.status_code == 400, bad
    assert status(db, failed) == "failed"
    assert db.execute("SELECT count(*) FROM asyncq_audit").fetchone() == (0,)
    async with client_for(create_app(app, read_only=True)) as reader:
        page = await reader.get("/jobs")
        assert 'id="bulk"' not in page.text
        refused = await reader.post("/jobs/bulk/run", data=confirm)
        assert refused.status_code == 403 and status(db, failed) == "failed"


async def test_the_audit_names_who_the_authorize_hook_says(
    app: asyncq.App, job: Job, db: psycopg.Connection[Any]
) -> None:
    from asyncq.dashboard import create_app

    job(status="failed")
    async with client_for(create_app(app, authorize=lambda request: "ada@ops")) as client:
        _, confirm = await preview(client, "requeue", status="failed")
        await run(client, confirm, db)
        assert ">ada@ops<" in (await client.get("/audit")).text
    assert db.execute("SELECT actor FROM asyncq_audit").fetchall() == [("ada@ops",)]


def status(db: psycopg.Connection[Any], job_id: int) -> str:
    row = db.execute("SELECT status::text FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def prio(db: psycopg.Connection[Any], job_id: int) -> int:
    row = db.execute("SELECT priority FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return int(row[0])


def queue_of(db: psycopg.Connection[Any], job_id: int) -> str:
    row = db.execute("SELECT queue FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


async def test_the_audit_names_the_logins_user(
    app: asyncq.App, job: Job, db: psycopg.Connection[Any]
) -> None:
    from asyncq.dashboard.app import build
    from asyncq.dashboard.login import Login

    job(status="failed")
    login = Login(user="grace", password="s3cret")
    asgi = build(app, read_only=False, authorize=None, secret=None, hosts=None, login=login)
    async with client_for(asgi) as client:
        client.auth = httpx.BasicAuth("grace", "s3cret")
        _, confirm = await preview(client, "requeue", status="failed")
        await run(client, confirm, db)
    assert db.execute("SELECT actor FROM asyncq_audit").fetchall() == [("grace",)]


@pytest.mark.parametrize(
    ("state", "index"), [("failed", "asyncq_jobs_ended"), ("done", "asyncq_jobs_done")]
)
def test_a_search_by_state_reads_through_that_states_index(
    db: psycopg.Connection[Any], state: str, index: str
) -> None:
    """Planned for its values (never prepared), a search by state can use the state's
    partial index: a generic "x IS NULL OR status = x" could not."""
    from asyncq import admin
    from asyncq.store import QUERIES

    params = {**admin.JobFilter(status=state).params(), "eligible": None, "at_most": 1001}
    db.execute("SET enable_seqscan = off")
    try:
        plan = "\n".join(
            str(row[0])
            for row in db.execute(
                "EXPLAIN " + QUERIES["count_matching"], params, prepare=False
            ).fetchall()
        )
    finally:
        db.execute("RESET enable_seqscan")
    assert index in plan, plan
