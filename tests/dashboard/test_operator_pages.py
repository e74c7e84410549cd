"""The pages that answer "who is working, what runs when, what did each attempt do":
workers, schedules, and a job's attempts, progress and logs, on a real database."""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg
import pytest

from tests.dashboard.conftest import Job, needs_the_extra

needs_the_extra()
pytestmark = pytest.mark.anyio


async def test_the_workers_page_lists_live_workers_and_the_dead(
    client: httpx.AsyncClient, db: psycopg.Connection[Any]
) -> None:
    db.execute(
        "INSERT INTO asyncq_workers (id, host, pid, version, app, queues, concurrency, running,"
        "                            beat, seen_at)"
        " VALUES ('web-1:41:a', 'web-1', 41, '9.8.7', 'shop:app', '{mail,sms}', 16, 3, '5 s',"
        "         now()),"
        "        ('web-2:42:b', 'web-2', 42, '9.8.7', NULL, NULL, 4, 0, '5 s',"
        "         now() - interval '1 min')"
    )
    page = await client.get("/workers")
    assert page.status_code == 200
    html = page.text
    assert "<title>Workers · asyncq</title>" in html
    assert "1 live, 1 dead" in html
    live = html[html.index("web-1:41:a") : html.index("</tr>", html.index("web-1:41:a"))]
    for shown in ("web-1", ">41<", "9.8.7", "shop:app", ">mail</a>", ">sms</a>", ">16<", ">3</a>"):
        assert shown in live, shown
    assert "live</span>" in live
    dead = html[html.index("web-2:42:b") : html.index("</tr>", html.index("web-2:42:b"))]
    assert "every queue" in dead and "dead</span>" in dead
    assert 'href="/workers"' in html  # in the navigation


async def test_the_workers_page_says_when_no_worker_runs(client: httpx.AsyncClient) -> None:
    page = await client.get("/workers")
    assert 'id="no-workers"' in page.text and "nothing consumes" in page.text


async def test_the_schedules_page_shows_the_slots_and_the_last_jobs_outcome(
    client: httpx.AsyncClient, db: psycopg.Connection[Any], job: Job
) -> None:
    last = job("reports.daily", status="failed", error="boom")
    db.execute(
        "INSERT INTO asyncq_schedules (name, task_name, cron, tz, last_slot, last_job_id)"
        " VALUES ('daily', 'reports.daily', '0 6 * * *', 'UTC', '2026-01-02 06:00+00', %s)",
        (last,),
    )
    page = await client.get("/schedules")
    assert page.status_code == 200
    row = page.text[page.text.index(">daily") :]
    row = row[: row.index("</tr>")]
    assert "0 6 * * *" in row and "reports.daily" in row
    assert 'datetime="2026-01-02T06:00:00+00:00"' in row  # the last slot
    assert row.count("<time ") == 2  # and the next one
    assert f'href="/jobs/{last}"' in row and "status-failed" in row


async def test_the_job_page_shows_each_attempt_its_progress_and_logs(
    client: httpx.AsyncClient, db: psycopg.Connection[Any], job: Job
) -> None:
    running = job("mail.send", status="running")
    history = {
        "dropped": 4,
        "attempts": [
            {
                "attempt": 1,
                "worker": "host-a:7:w",
                "due_at": "2026-01-02T10:00:00+00:00",
                "started_at": "2026-01-02T10:00:02+00:00",
                "ended_at": "2026-01-02T10:00:05+00:00",
                "outcome": "retried",
                "error": "Traceback (most recent call last):\nValueError: smtp said no",
                "logs": {
                    "records": [
                        {
                            "at": "2026-01-02T10:00:03+00:00",
                            "level": "WARNING",
                            "logger": "mail",
                            "message": "slow server",
                        }
                    ],
                    "dropped": 0,
                },
            }
        ],
    }
    progress = {"fraction": 0.25, "message": "a quarter sent", "attempt": 2}
    db.execute(
        "UPDATE asyncq_jobs SET history = %s, progress = %s, attempts = 2,"
        " run_at = now() - interval '3 s', started_at = now() - interval '1 s' WHERE id = %s",
        (json.dumps(history), json.dumps(progress), running),
    )
    page = await client.get(f"/jobs/{running}")
    html = page.text
    assert f"<title>Job {running} · mail.send (running) · asyncq</title>" in html
    attempts = html[html.index('id="attempts"') : html.index("</ol>")]
    assert attempts.count('<li class="attempt') == 2
    first, second = attempts.split('<li class="attempt')[1:]
    assert "retried" in first and "host-a:7:w" in first and "attempt 1" in first
    assert "ran 3.0s" in first and "waited 2.0s" in first
    assert "ValueError: smtp said no" in first and "slow server" in first
    assert "running" in second and "attempt 2" in second and "w1" in second
    assert "4 attempts between the first 3 and the last 10" in html
    assert 'id="progress"' in html and "25%" in html and "a quarter sent" in html
    assert 'id="wait-time">2.0s' in html
