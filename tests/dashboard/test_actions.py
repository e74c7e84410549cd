"""The dashboard's actions: only by POST, only with the page's CSRF token, never when
read-only; each one's effect is read back from the table."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

import asyncq
from tests.dashboard.conftest import Job, client_for, csrf_token, needs_the_extra, status_of

needs_the_extra()
pytestmark = pytest.mark.anyio


async def test_requeue_and_cancel_a_job(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any]
) -> None:
    failed = job(status="failed", error="boom", attempts=3)
    page = await client.get(f"/jobs/{failed}")
    token = csrf_token(page.text)
    done = await client.post(f"/jobs/{failed}/requeue", data={"csrf": token})
    assert done.status_code == 303
    assert done.headers["location"] == f"/jobs/{failed}?notice=requeued"
    assert status_of(db, failed) == "queued"
    shown = await client.get(done.headers["location"])
    assert "Requeued" in shown.text and 'id="cancel"' in shown.text
    again = await client.post(f"/jobs/{failed}/requeue", data={"csrf": token})
    assert again.headers["location"].endswith("notice=not-requeued")

    cancelled = await client.post(f"/jobs/{failed}/cancel", data={"csrf": token})
    assert cancelled.headers["location"] == f"/jobs/{failed}?notice=cancelled"
    assert status_of(db, failed) == "cancelled"
    running = job(status="running")
    aborting = await client.post(f"/jobs/{running}/cancel", data={"csrf": token})
    assert aborting.headers["location"].endswith("notice=aborting")
    assert db.execute(
        "SELECT abort_requested_at IS NOT NULL FROM asyncq_jobs WHERE id = %s", (running,)
    ).fetchone() == (True,)


async def test_pause_and_resume_a_queue(
    client: httpx.AsyncClient, app: asyncq.App, job: Job
) -> None:
    job(queue="mail")
    token = csrf_token((await client.get("/")).text)
    paused = await client.post("/queues/pause", data={"csrf": token, "queue": "mail"})
    assert paused.status_code == 303 and paused.headers["location"] == "/?notice=paused"
    assert await _paused(app) == {"mail": True}
    page = await client.get(paused.headers["location"])
    assert 'class="paused"' in page.text and "Paused: no worker" in page.text
    resumed = await client.post("/queues/resume", data={"csrf": token, "queue": "mail"})
    assert resumed.headers["location"] == "/?notice=resumed"
    assert await _paused(app) == {"mail": False}
    nameless = await client.post("/queues/pause", data={"csrf": token, "queue": ""})
    assert nameless.status_code == 400


async def test_an_action_without_a_valid_token_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any], app: asyncq.App
) -> None:
    failed = job(status="failed")
    token = csrf_token((await client.get(f"/jobs/{failed}")).text)
    forged = [
        {},  # no token
        {"csrf": ""},
        {"csrf": "0" * 64},  # a token of the right shape, not signed for this cookie
        {"csrf": token[:-1] + ("0" if token[-1] != "0" else "1")},
    ]
    for form in forged:
        refused = await client.post(f"/jobs/{failed}/requeue", data=form)
        assert refused.status_code == 403, form
    # The right token from another site's page (the browser sends its Origin, or at
    # least its Referer).
    for sent in ({"origin": "http://evil.test"}, {"referer": "http://evil.test/x"}):
        cross = await client.post(f"/jobs/{failed}/requeue", data={"csrf": token}, headers=sent)
        assert cross.status_code == 403, sent
    # The right token without the cookie it was signed for: a new visitor's browser.
    async with client_for(client._transport.app) as stranger:  # type: ignore[attr-defined]
        alone = await stranger.post(f"/jobs/{failed}/requeue", data={"csrf": token})
    assert alone.status_code == 403
    paused = await client.post("/queues/pause", data={"queue": "default"})
    assert paused.status_code == 403
    assert status_of(db, failed) == "failed"
    assert await _paused(app) == {}
    # GET never acts.
    assert (await client.get(f"/jobs/{failed}/requeue")).status_code == 405
    assert (await client.get("/queues/pause?queue=default")).status_code == 405
    assert status_of(db, failed) == "failed"


async def test_the_csrf_cookie_is_httponly_and_strict(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    cookie = page.headers["set-cookie"].lower()
    assert cookie.startswith("asyncq_csrf=")
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    assert "set-cookie" not in (await client.get("/")).headers  # the same nonce thereafter


async def test_read_only_hides_the_actions_and_refuses_them(
    app: asyncq.App, job: Job, db: psycopg.Connection[Any]
) -> None:
    from asyncq.dashboard import create_app

    failed = job(status="failed", queue="mail")
    queued = job(queue="mail")
    async with client_for(create_app(app, read_only=True)) as client:
        pages = [await client.get(p) for p in ("/", "/jobs", f"/jobs/{failed}", f"/jobs/{queued}")]
        for page in pages:
            assert page.status_code == 200
            assert "<form" not in page.text.replace('<form class="filters" method="get"', "")
            assert "<button" not in page.text.replace('<button type="submit">Filter', "")
        async with client_for(create_app(app)) as writable:
            token = csrf_token((await writable.get("/")).text)
            client.cookies.update(writable.cookies)
        for path, form in (
            (f"/jobs/{failed}/requeue", {}),
            (f"/jobs/{queued}/cancel", {}),
            ("/queues/pause", {"queue": "mail"}),
            ("/queues/resume", {"queue": "mail"}),
        ):
            refused = await client.post(path, data={"csrf": token, **form})
            assert refused.status_code == 403, path
            assert "read-only" in refused.text
    assert status_of(db, failed) == "failed" and status_of(db, queued) == "queued"
    assert await _paused(app) == {}


async def _paused(app: asyncq.App) -> dict[str, bool]:
    async with app.pool.connection() as conn:
        cur = await conn.execute("SELECT name, paused_at IS NOT NULL FROM asyncq_queues")
        return dict(await cur.fetchall())
