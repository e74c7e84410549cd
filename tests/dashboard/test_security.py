"""Who may see the dashboard (the host's authorize hook), the Host names it answers to and
the pages it takes actions from, mounting it under a prefix, escaping of hostile values,
and the headers every response carries. (``asyncq dashboard`` itself, its login and its
own list of names: test_served.py.)"""

from __future__ import annotations

import re
from typing import Any

import httpx
import psycopg
import pytest

import asyncq
from tests.dashboard.conftest import Job, client_for, csrf_token, needs_the_extra, status_of

needs_the_extra()
pytestmark = pytest.mark.anyio

SCRIPT = "<script>window.pwned = 1</script>"
IMG = '<img src=x onerror="window.pwned = 2">'
HOSTILE = f"{SCRIPT}{IMG}'\"&"


async def test_authorize_refuses_every_route_with_403(app: asyncq.App, job: Job) -> None:
    from starlette.requests import Request

    from asyncq.dashboard import create_app

    failed = job(status="failed")
    asked: list[str] = []

    async def only_admins(request: Request) -> bool:
        asked.append(request.url.path)
        return request.headers.get("x-role") == "admin"

    async with client_for(create_app(app, authorize=only_admins)) as client:
        routes = ["/", "/jobs", f"/jobs/{failed}", "/metrics", "/style.css"]
        for path in routes:
            refused = await client.get(path)
            assert refused.status_code == 403, path
            assert "csrf" not in refused.text and "set-cookie" not in refused.headers
        refused = await client.post(f"/jobs/{failed}/requeue")
        assert refused.status_code == 403
        client.headers["x-role"] = "admin"
        for path in routes:
            assert (await client.get(path)).status_code == 200, path
    assert asked[: len(routes)] == routes
    # A plain (not async) callable works too; anything but True or a name (who asks)
    # refuses.
    for verdict in (False, None, 1, "", b"admin"):
        async with client_for(create_app(app, authorize=lambda r, v=verdict: v)) as client:
            assert (await client.get("/")).status_code == 403, verdict
    assert status_of_failed(app, failed) == "failed"


async def test_allowed_hosts_answer_their_names_and_ports_and_nothing_else(
    app: asyncq.App, job: Job
) -> None:
    from asyncq.dashboard import create_app

    failed = job(status="failed", args='{"card": "4111 1111 1111 1111"}')
    allowed = ["dash.test:8080", "[::1]:8080", "Jobs.Example.com"]
    answered = [
        "dash.test:8080",
        "DASH.test:8080",
        "[::1]:8080",
        "jobs.example.com",
        "jobs.example.com:8443",
    ]
    refused = [
        "evil.example",
        "evil.example:8080",
        "dash.test",  # port 80
        "dash.test:8081",
        "[::1]",
        "[::1]:8081",
        "::1:8080",
        "jobs.example.com.evil.example",
        "evil.example@jobs.example.com",
        "jobs.example.com:x",
        "",
    ]
    async with client_for(create_app(app, allowed_hosts=allowed)) as client:
        for host in answered:
            page = await client.get(f"/jobs/{failed}", headers={"host": host})
            assert page.status_code == 200 and "4111" in page.text, host
        for host in refused:
            refusal = await client.get(f"/jobs/{failed}", headers={"host": host})
            assert refusal.status_code == 400, host
            assert refusal.text.count("\n") == 1 and "--allowed-host NAME" in refusal.text
            assert "4111" not in refusal.text and "set-cookie" not in refusal.headers
    for wrong in (["http://dash.test"], ["dash.test:0"], ["dash.test/x"], ["a b"], [""]):
        with pytest.raises(ValueError, match="is not a host: NAME or NAME:PORT"):
            create_app(app, allowed_hosts=wrong)
    with pytest.raises(TypeError, match="a list of names"):
        create_app(app, allowed_hosts="dash.test")


async def test_an_action_from_another_site_is_refused_even_from_an_allowed_host(
    app: asyncq.App, job: Job, db: psycopg.Connection[Any]
) -> None:
    from asyncq.dashboard import create_app

    failed = job(status="failed")
    dashboard = create_app(app, allowed_hosts=["dash.test:80", "jobs.example.com"])
    async with client_for(dashboard) as client:  # Host: dash.test, which is allowed
        token = csrf_token((await client.get(f"/jobs/{failed}")).text)
        others = [
            {"origin": "http://evil.test"},
            {"origin": "http://dash.test.evil.test"},
            {"origin": "http://dash.test:3000"},  # another service of the same machine
            {"origin": "null"},  # a sandboxed frame, a redirect from elsewhere
            {"origin": "http://[dash.test"},
            {"referer": "http://evil.test/dash.test/jobs"},
            {"referer": "http://evil.test:80/"},
            {"origin": "http://evil.test", "referer": "http://dash.test/jobs"},
        ]
        for headers in others:
            refused = await client.post(
                f"/jobs/{failed}/requeue", data={"csrf": token}, headers=headers
            )
            assert refused.status_code == 403, headers
        assert status_of(db, failed) == "failed"
        # The dashboard's own page, and the name a proxy serves it by (whose Host the
        # proxy does not pass on), may act.
        for headers in (
            {"referer": f"http://dash.test/jobs/{failed}"},
            {"origin": "http://dash.test"},
            {"origin": "https://jobs.example.com"},
        ):
            done = await client.post(
                f"/jobs/{failed}/requeue", data={"csrf": token}, headers=headers
            )
            assert done.status_code == 303, headers
            await client.post(f"/jobs/{failed}/cancel", data={"csrf": token}, headers=headers)
            assert status_of(db, failed) == "cancelled", headers


def status_of_failed(app: asyncq.App, job_id: int) -> str:
    with psycopg.connect(app.dsn) as conn:
        return status_of(conn, job_id)


async def test_mounted_in_a_fastapi_service_under_a_prefix(
    app: asyncq.App, job: Job, db: psycopg.Connection[Any]
) -> None:
    from fastapi import FastAPI

    from asyncq.dashboard import create_app

    failed = job(status="failed")
    service = FastAPI()

    @service.get("/health")
    async def health() -> dict[str, str]:
        return {"ok": "yes"}

    service.mount("/admin/jobs", create_app(app, authorize=lambda r: "x-staff" in r.headers))
    async with client_for(service) as client:
        assert (await client.get("/health")).json() == {"ok": "yes"}
        assert (await client.get("/admin/jobs/")).status_code == 403
        client.headers["x-staff"] = "1"
        page = await client.get(f"/admin/jobs/jobs/{failed}")
        assert page.status_code == 200
        assert 'href="/admin/jobs/style.css"' in page.text
        assert f'action="/admin/jobs/jobs/{failed}/requeue"' in page.text
        assert "path=/admin/jobs;" in page.headers["set-cookie"].lower()
        listing = await client.get("/admin/jobs/jobs")
        assert f'href="/admin/jobs/jobs/{failed}"' in listing.text
        done = await client.post(
            f"/admin/jobs/jobs/{failed}/requeue", data={"csrf": csrf_token(page.text)}
        )
        assert done.status_code == 303
        assert done.headers["location"] == f"/admin/jobs/jobs/{failed}?notice=requeued"
    assert status_of(db, failed) == "queued"


async def test_hostile_names_arguments_and_errors_are_escaped(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any]
) -> None:
    import json

    ids = [
        job(
            HOSTILE,
            queue=HOSTILE,
            status=status,
            args=json.dumps({HOSTILE: HOSTILE}),
            error=f"{HOSTILE}\n{HOSTILE}",
            result=json.dumps(HOSTILE) if status == "done" else None,
        )
        for status in ("failed", "done", "queued")
    ]
    db.execute(
        "INSERT INTO asyncq_schedules (name, task_name, cron, tz, queue, last_slot)"
        " VALUES (%s, %s, '* * * * *', 'UTC', %s, now())",
        (HOSTILE, HOSTILE, HOSTILE),
    )
    db.execute(
        "INSERT INTO asyncq_workers (id, host, pid, version, app, queues, concurrency, beat)"
        " VALUES (%s, %s, 1, %s, %s, ARRAY[%s], 1, '5 s')",
        (HOSTILE, HOSTILE, HOSTILE, HOSTILE, HOSTILE),
    )
    db.execute(
        "INSERT INTO asyncq_audit (actor, action, filter, detail, rows, matched)"
        " VALUES (%s, %s, %s, %s, 1, 1)",
        (HOSTILE, HOSTILE, json.dumps({"queue": HOSTILE}), json.dumps({"queue": HOSTILE})),
    )
    pages = ["/", "/jobs", "/jobs?status=failed", *(f"/jobs/{i}" for i in ids)]
    pages += ["/workers", "/schedules", "/audit"]
    pages.append("/jobs?" + httpx.QueryParams({"queue": HOSTILE, "task": HOSTILE}).__str__())
    pages.append("/jobs?" + httpx.QueryParams({"text": HOSTILE}).__str__())
    token = csrf_token((await client.get("/jobs")).text)
    for path in [*pages, "preview"]:
        if path == "preview":  # a bulk action's preview shows the filter it was given
            form = {"csrf": token, "action": "move", "queue": HOSTILE, "to_queue": HOSTILE}
            page = await client.post("/jobs/bulk/preview", data=form)
        else:
            page = await client.get(path)
        assert page.status_code == 200, path
        html = page.text
        assert HOSTILE[:8] not in html
        # The one script is the dashboard's own file, in the head.
        assert html.count('<script src="/live.js" defer></script>') == 1, path
        html = html.replace('<script src="/live.js" defer></script>', "")
        assert not re.search(r"<script|<img", html, re.IGNORECASE), path
        # onerror= only as text, inside the escaped tag (never an attribute of a tag)
        inert = re.sub(r"&lt;img src=x onerror=\\?&#34;", "", html)
        assert inert != html and "onerror=" not in inert.lower(), path
        assert "&lt;script&gt;" in html, path


async def test_every_response_carries_a_strict_content_security_policy(
    client: httpx.AsyncClient, job: Job
) -> None:
    failed = job(status="failed")
    for path in ("/", "/jobs", f"/jobs/{failed}", "/jobs/999", "/jobs?status=x", "/metrics"):
        headers = (await client.get(path)).headers
        policy = headers["content-security-policy"]
        assert "default-src 'none'" in policy, path
        # Scripts and fetches of the dashboard's own only, never inline code.
        assert "script-src 'self';" in policy and "connect-src 'self';" in policy, path
        assert "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["cache-control"] == "no-store"
    refused = await client.post(f"/jobs/{failed}/cancel")
    assert refused.status_code == 403 and "content-security-policy" in refused.headers
