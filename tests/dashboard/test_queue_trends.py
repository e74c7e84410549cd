"""The queues page's numbers over time, through its ASGI app on a real database: per
queue, the ready jobs, the jobs done per minute and the wait over the last hour, read
from the jobs' own times; and no number on the page contradicts another."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import psycopg
import pytest

import asyncq
from asyncq import admin
from tests.dashboard.conftest import needs_the_extra

needs_the_extra()
pytestmark = pytest.mark.anyio


AT = "(date_trunc('minute', now()) + interval '50 seconds')"


def write(db: psycopg.Connection[Any], queue: str, status: str, **ago: float | None) -> None:
    """A job of ``queue`` whose times are so many minutes before the 50th second of the
    clock minute now in (negative: after it): the minute a time falls in does not hang on
    when the test runs."""
    times = {k: ago.get(k) for k in ("run_at", "started_at", "finished_at")}
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue, status, run_at, started_at, finished_at,"
        "                         expires_at)"
        " VALUES ('t', %s, %s,"
        f"         {AT} - make_interval(secs => %s * 60),"
        f"         {AT} - make_interval(secs => %s * 60),"
        f"         {AT} - make_interval(secs => %s * 60),"
        "         CASE WHEN %s = 'running' THEN now() + interval '1 minute' END)",
        (queue, status, times["run_at"] or 0.0, times["started_at"], times["finished_at"], status),
    )


@pytest.fixture
def known(db: psycopg.Connection[Any]) -> None:
    # The jobs written and the history read within one clock minute.
    second = datetime.now(UTC).second
    if second >= 55:
        time.sleep(61 - second)
    # mail: three jobs done 10, 20 and 30 minutes ago, each due 40 s (2/3 minute) before it
    # started; one done two hours ago (not in the last hour); two ready for the last five
    # minutes and one due in ten.
    for minutes in (10.0, 20.0, 30.0):
        start = minutes + 0.05
        write(db, "mail", "done", run_at=start + 2 / 3, started_at=start, finished_at=minutes)
    write(db, "mail", "done", run_at=121.0, started_at=120.5, finished_at=120.0)
    write(db, "mail", "queued", run_at=5.0)
    write(db, "mail", "queued", run_at=5.0)
    write(db, "mail", "queued", run_at=-10.0)
    # reports: one job claimed two minutes after it was due, still running.
    write(db, "reports", "running", run_at=3.5, started_at=1.5)


async def test_a_queues_history_minute_by_minute(app: asyncq.App, known: None) -> None:
    async with app.pool.connection() as conn:
        history = await admin.queue_history(conn, app.store, minutes=60)
        overview = {q.name: q for q in await admin.queues(conn, app.store)}
    mail, reports = history["mail"], history["reports"]
    # Ready: nothing until five minutes ago, then the two queued jobs (the done ones
    # waited 40 s each, within their minute); none of the job due later.
    assert mail.depth[-1] == overview["mail"].ready == 2
    assert mail.depth[:50] == [0] * 50
    assert mail.depth[-5:] == [2] * 5
    # Done: one in each of the minutes ten, twenty and thirty ago; as many as done (1h).
    assert sum(mail.done) == overview["mail"].done_last_hour == 3
    assert [i for i, n in enumerate(mail.done) if n] == [29, 39, 49]
    # Waits: 40 s for each job claimed in the hour, none in the other minutes.
    waits = [w for w in mail.wait_max if w is not None]
    assert len(waits) == 3 and all(abs(w - 40.0) < 0.5 for w in waits)
    assert sum(mail.started) == 3
    # reports: ready from 3.5 minutes ago until claimed 1.5 minutes ago: ready at the end
    # of the minutes that ended three and two minutes ago.
    assert reports.depth[-6:] == [0, 0, 1, 1, 0, 0]
    assert reports.wait_max[-2] == pytest.approx(120.0, abs=0.5)
    assert overview["reports"].ready == 0 and overview["reports"].running == 1


async def test_the_minutes_samples_counted_whole_come_from_them_the_rest_from_the_jobs(
    app: asyncq.App, db: psycopg.Connection[Any]
) -> None:
    if datetime.now(UTC).second >= 55:  # written and read within one clock minute
        await anyio.sleep(6)
    # Samples of each minute of the last hour but the one now in, counted after it ended;
    # and the jobs of the minute now in: one done, two ready.
    db.execute(
        "INSERT INTO asyncq_queue_samples"
        "       (queue, minute, depth, running, done, started, wait_sum, wait_max, sampled_at)"
        " SELECT 'mail', date_trunc('minute', now()) - make_interval(mins => m), 4, 0, 2, 2,"
        "        3.0, 2.0, date_trunc('minute', now()) - make_interval(mins => m - 1)"
        "   FROM generate_series(1, 59) AS m"
    )
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue, status, run_at, started_at, finished_at)"
        " VALUES ('t', 'mail', 'done', now(), now(), now()),"
        "        ('t', 'mail', 'queued', now(), NULL, NULL),"
        "        ('t', 'mail', 'queued', now(), NULL, NULL)"
    )
    async with app.pool.connection() as conn:
        mail = (await admin.queue_history(conn, app.store, minutes=60))["mail"]
        day = (await admin.queue_history(conn, app.store, minutes=1440, per=15))["mail"]
    assert mail.done == [2] * 59 + [1]
    assert mail.depth == [4] * 59 + [2]
    assert mail.wait_max == [2.0] * 59 + [0.0]
    assert mail.wait_avg[:59] == [1.5] * 59
    # A day in quarters: the samples' last hour is in the last four, the rest unknown.
    assert sum(day.done) == 2 * 59 + 1
    assert day.depth[:-5] == [None] * 91 and day.depth[-1] == 2
    assert day.done[-4:-1] == [30, 30, 30]


async def test_the_queues_page_shows_each_queues_trends_and_counts_that_agree(
    client: httpx.AsyncClient, known: None, db: psycopg.Connection[Any]
) -> None:
    # The statistics have not seen the jobs yet (they lag behind the table): estimated from
    # them alone, the done jobs kept would be none, beside three done in the last hour.
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT 1")
    db.execute("SELECT pg_stat_reset_single_table_counters('asyncq_jobs'::regclass)")
    page = await client.get("/")
    assert page.status_code == 200
    html = page.text
    row = html[html.index('<tr>\n  <td><a href="/jobs?queue=mail">mail</a>') :]
    row = row[: row.index("</tr>")]
    cells = re.findall(r'<td class="num">(?:<a [^>]*>)?([^<]*)', row)
    # ready, scheduled, oldest ready, running, waiting, failed, done (1h)
    assert cells[0] == "2" and cells[1] == "1" and cells[6] == "3", cells
    trend = html[html.index('<tr data-queue="mail">') :]
    trend = trend[: trend.index("</tr>")]
    lasts = re.findall(r'class="spark-last">([^<]*)<', trend)
    peaks = re.findall(r'class="spark-peak">([^<]*)<', trend)
    assert lasts[0] == "2" and peaks[0] == "2"  # ready now, and at most
    assert peaks[1] == "1"  # done in a minute, at most
    assert peaks[2] == "40s"  # the longest wait
    assert trend.count("<polyline") == 2  # ready and done/min: a line each
    assert trend.count("<circle") == 3  # a wait in each of three minutes, alone
    # Every job in the table by state: done never fewer than the three of the last hour.
    states = html[html.index('<table id="states"') :]
    states = states[: states.index("</table>")]
    done = re.search(r"status=done\">≈(\d+)<", states)
    assert done is not None and int(done.group(1)) >= 3, states
    assert "done (kept, estimated)" in states


async def test_the_queues_page_shows_each_limit_with_its_source(
    app: asyncq.App, client: httpx.AsyncClient
) -> None:
    @app.task(name="mail.send", queue="mail", concurrency=2)
    async def send() -> None: ...

    @app.task(name="plain")
    async def plain() -> None: ...

    page = (await client.get("/")).text
    row = re.search(r"<tr><td>mail\.send</td>.*?</tr>", page, re.S)
    assert row and "2 <small>code</small>" in row[0]
    await app.set_limits("mail.send", concurrency=5, rate_limit="10/s")
    page = (await client.get("/")).text
    row = re.search(r"<tr><td>mail\.send</td>.*?</tr>", page, re.S)
    assert row, page
    assert "5 <small>override</small>" in row[0]
    assert "<small>override</small>" in row[0].split("</td>")[3]  # the rate, set at runtime
    assert "<td>plain</td>" not in page  # no limit: not listed
    await app.reset_limits("mail.send")
    page = (await client.get("/")).text
    assert "2 <small>code</small>" in page and "override" not in page.split('id="limits"')[1]
