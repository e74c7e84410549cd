"""Every page of the dashboard, through its ASGI app, on a real database."""

from __future__ import annotations

import re
from typing import Any

import httpx
import psycopg
import pytest

import asyncq
from tests.dashboard.conftest import Job, client_for, needs_the_extra

needs_the_extra()
pytestmark = pytest.mark.anyio


async def test_the_queues_page_shows_counts_pause_state_and_the_chart(
    client: httpx.AsyncClient, job: Job, db: psycopg.Connection[Any]
) -> None:
    job(queue="mail")
    job(queue="mail", status="failed", error="boom")
    job(queue="reports", status="done")
    db.execute("INSERT INTO asyncq_queues (name, paused_at) VALUES ('reports', now())")
    page = await client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    mail = html[html.index(">mail</a>") : html.index("</tr>", html.index(">mail</a>"))]
    assert 'status=queued">1</a>' in mail and 'status=failed">1</a>' in mail
    assert "active" in mail and "Pause" in mail
    reports = html[html.index(">reports</a>") :]
    assert 'class="paused"' in reports[: reports.index("</tr>")]
    assert "Resume" in reports[: reports.index("</tr>")]
    assert '<svg id="throughput"' in html
    # The done and the failed job ended this minute: two bars in the chart.
    assert html.count("</title></rect>") == 2, html


async def test_the_jobs_page_filters_by_status_queue_and_task(
    client: httpx.AsyncClient, job: Job
) -> None:
    failed = job("a.task", queue="mail", status="failed", error="boom\nmore")
    job("a.task", queue="other", status="failed")
    job("b.task", queue="mail", status="failed")
    queued = job("a.task", queue="mail")
    page = await client.get("/jobs", params={"status": "failed", "queue": "mail", "task": "a.task"})
    assert page.status_code == 200
    ids = _listed(page.text)
    assert ids == [failed]
    assert ">boom<" in page.text  # the first line of the error
    everything = _listed((await client.get("/jobs")).text)
    assert everything[0] == queued and len(everything) == 4


async def test_the_jobs_page_pages_on_fifty_at_a_time_saying_how_many(
    client: httpx.AsyncClient, job: Job
) -> None:
    ids = [job("t", status="done") for _ in range(120)]
    first = await client.get("/jobs")
    assert _listed(first.text) == ids[::-1][:50]
    assert "50 of 120 shown (1 to 50, page 1 of 3)" in first.text
    assert 'id="newer"' not in first.text
    more = _more(first.text)
    assert more == "/jobs?page=2"
    second = await client.get(more)
    assert _listed(second.text) == ids[::-1][50:100]
    assert "50 of 120 shown (51 to 100, page 2 of 3)" in second.text
    third = await client.get(_more(second.text))
    assert _listed(third.text) == ids[::-1][100:]
    assert "20 of 120 shown (101 to 120, page 3 of 3)" in third.text
    assert 'id="more"' not in third.text and '<a id="newer" href="/jobs?page=2">' in third.text
    queued = [job("t", queue="mail") for _ in range(60)]
    backlog = await client.get("/jobs?status=queued&queue=mail")
    assert _listed(backlog.text) == queued[::-1][:50]
    assert "50 of 60 shown" in backlog.text
    assert _more(backlog.text) == "/jobs?status=queued&queue=mail&page=2"
    assert _listed((await client.get(_more(backlog.text))).text) == queued[::-1][50:]


async def test_a_jobs_detail_shows_arguments_error_result_and_timeline(
    client: httpx.AsyncClient, job: Job
) -> None:
    traceback = 'Traceback (most recent call last):\n  File "t.py", line 1\nRuntimeError: boom'
    failed = job("mail.send", status="failed", args='{"to": "ä@example.com"}', error=traceback)
    done = job("mail.send", status="done", result='{"sent": 3}')
    page = await client.get(f"/jobs/{failed}")
    assert page.status_code == 200
    html = page.text
    assert "ä@example.com" in html
    assert "Traceback (most recent call last):" in html and "RuntimeError: boom" in html
    for moment in ("created", "run at", "finished"):
        assert f"<th>{moment}</th>" in html
    assert 'id="requeue"' in html and 'id="cancel"' not in html
    assert "&#34;sent&#34;: 3" in (await client.get(f"/jobs/{done}")).text
    assert 'id="cancel"' in (await client.get(f"/jobs/{job()}")).text


async def test_a_missing_job_and_bad_queries_are_refused_clearly(
    client: httpx.AsyncClient,
) -> None:
    missing = await client.get("/jobs/12345")
    assert missing.status_code == 404 and "No job 12345" in missing.text
    bad = (
        "status=stuck",
        "page=abc",
        "page=0",
        "page=201",
        "id=-1",
        "id=x",
        "window=3y",
        "from=yesterday",
        "to=2026-13-01",
        "queue=%01",
    )
    for query in bad:
        refused = await client.get(f"/jobs?{query}")
        assert refused.status_code == 400, query
        assert refused.text.startswith("bad request:"), refused.text
    assert (await client.get(f"/jobs/{2**63}")).status_code == 400


async def test_metrics_show_the_queue_depth(client: httpx.AsyncClient, job: Job) -> None:
    job(queue='odd "queue"\\')
    job(queue="mail", status="failed")
    found = await client.get("/metrics")
    assert found.status_code == 200
    assert found.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'asyncq_queue_jobs{queue="odd \\"queue\\"\\\\",state="ready"} 1' in found.text
    assert 'asyncq_queue_jobs{queue="mail",state="failed"} 1' in found.text
    assert 'asyncq_queue_paused{queue="mail"} 0' in found.text
    assert 'asyncq_workers{state="live"} 0' in found.text


async def test_metrics_count_the_workers_live_and_dead(
    client: httpx.AsyncClient, db: psycopg.Connection[Any]
) -> None:
    db.execute(
        "INSERT INTO asyncq_workers (id, host, pid, version, concurrency, beat, seen_at)"
        " VALUES ('a:1:x', 'a', 1, '0.1.0', 10, '5 s', now()),"
        "        ('b:2:y', 'b', 2, '0.1.0', 10, '5 s', now()),"
        "        ('c:3:z', 'c', 3, '0.1.0', 10, '5 s', now() - interval '1 min')"
    )
    found = (await client.get("/metrics")).text
    assert 'asyncq_workers{state="live"} 2' in found
    assert 'asyncq_workers{state="dead"} 1' in found


async def test_the_stylesheet_script_and_icon_are_served(client: httpx.AsyncClient) -> None:
    found = await client.get("/style.css")
    assert found.status_code == 200 and found.headers["content-type"].startswith("text/css")
    script = await client.get("/live.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "data-live" in script.text and "localStorage" in script.text
    icon = await client.get("/favicon.svg")
    assert icon.headers["content-type"] == "image/svg+xml" and icon.text.startswith("<svg ")
    page = (await client.get("/")).text
    assert '<link rel="icon" href="/favicon.svg" type="image/svg+xml">' in page
    assert '<script src="/live.js" defer></script>' in page
    assert '<div id="queues-box" data-live>' in page


def _listed(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<td class="num"><a href="/jobs/(\d+)">', html)]


def _more(html: str) -> str:
    found = re.search(r'<a id="more" href="([^"]+)"', html)
    assert found, "no link to more jobs"
    return found[1].replace("&amp;", "&")


async def test_the_queues_page_warns_when_autovacuum_is_off_for_the_jobs_table(
    client: httpx.AsyncClient, db: psycopg.Connection[Any]
) -> None:
    db.execute("ALTER TABLE asyncq_jobs SET (autovacuum_enabled = false)")
    try:
        page = await client.get("/")
    finally:
        db.execute("ALTER TABLE asyncq_jobs RESET (autovacuum_enabled)")
    assert page.status_code == 200
    warnings = re.findall(r'<p class="warning">([^<]*)</p>', page.text)
    assert [w for w in warnings if w.startswith("autovacuum is off for asyncq_jobs")], warnings


async def test_a_never_migrated_database_gets_a_page_that_says_to_migrate(
    throwaway_dsn: str,
) -> None:
    from asyncq.dashboard import create_app

    async with asyncq.App(throwaway_dsn) as app, client_for(create_app(app)) as client:
        for path in ("/", "/jobs", "/jobs/1", "/jobs?status=failed"):
            page = await client.get(path)
            assert page.status_code == 503, (path, page.text)
            assert page.headers["content-type"].startswith("text/html")
            [problem] = re.findall(r'<p class="warning" id="problem">([^<]*)</p>', page.text)
            assert problem.startswith("there is no asyncq_"), problem
            assert "run `asyncq migrate MODULE:APP` (or `await app.migrate()`) first" in problem
        metrics = await client.get("/metrics")
        assert metrics.status_code == 503 and "asyncq migrate" in metrics.text
