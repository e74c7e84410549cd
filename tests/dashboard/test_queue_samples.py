"""The queues page's trends outlive pruning: a real worker process samples each queue
minute by minute (asyncq_queue_samples) while its pruner deletes the jobs it ran, and the
page still shows them done; the samples past their retention go."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import asyncq
from asyncq import admin
from tests.dashboard import sampled_worker
from tests.dashboard.conftest import needs_the_extra
from tests.harness.processes import WorkerProcess, Workers
from tests.harness.waiting import wait_until

needs_the_extra()
pytestmark = pytest.mark.anyio


def spark_peaks(html: str, queue: str) -> list[str]:
    row = html[html.index(f'<tr data-queue="{queue}">') :]
    return re.findall(r'class="spark-peak">([^<]*)<', row[: row.index("</tr>")])


async def test_the_queue_trends_show_jobs_done_after_they_are_pruned(
    app: asyncq.App,
    client: httpx.AsyncClient,
    db: psycopg.Connection[Any],
    workers: Workers,
    tmp_path: Path,
) -> None:
    # A sample eight days old, past the default retention of seven.
    db.execute(
        "INSERT INTO asyncq_queue_samples (queue, minute, depth, running, done, sampled_at)"
        " VALUES ('trends', date_trunc('minute', now()) - interval '8 days', 0, 0, 9, now())"
    )
    send = app.task(name="trends.send", queue=sampled_worker.QUEUE, max_attempts=1)(
        sampled_worker.send.fn
    )
    worker = WorkerProcess(
        [sys.executable, "-m", "tests.dashboard.sampled_worker"],
        workers.env(),
        tmp_path / "worker.log",
    ).wait_ready()
    try:
        ids = [await send.defer() for _ in range(5)] + [await send.defer(fail=True)]

        def all_pruned() -> bool:
            (left,) = db.execute(
                "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND status <> 'failed'",
                (ids,),
            ).fetchone() or (None,)
            return left == 0

        wait_until(all_pruned, 30, "the done jobs to be pruned")

        # The pruner and the sampler run in turn: wait for a pass after the last prune.
        def sampled() -> bool:
            (done,) = db.execute(
                "SELECT coalesce(sum(done), 0) FROM asyncq_queue_samples"
                " WHERE queue = 'trends' AND minute > now() - interval '1 day'"
            ).fetchone() or (None,)
            return done == 5

        wait_until(sampled, 30, "the samples to count the five jobs done")
        gone = db.execute(
            "SELECT count(*) FROM asyncq_queue_samples WHERE minute < now() - interval '7 days'"
        ).fetchone()
        assert gone == (0,)
    finally:
        worker.send(2)  # SIGINT: the worker stops
        worker.wait(30)

    async with app.pool.connection() as conn:
        hour = (await admin.queue_history(conn, app.store))["trends"]
        week = (await admin.queue_history(conn, app.store, minutes=7 * 24 * 60, per=60))["trends"]
    assert sum(hour.done) == 5 and sum(hour.started) == 6
    assert sum(week.done) == 5 and len(week.done) == 7 * 24
    html = (await client.get("/")).text
    # ready, done/min, longest wait: the peak minute's done jobs, none of them in the table.
    assert spark_peaks(html, "trends")[1] == str(max(hour.done))
    assert int(spark_peaks(html, "trends")[1]) >= 3  # the five in one minute, or two
    week_html = (await client.get("/?window=7d")).text
    assert "Each queue over the last 7 days" in week_html
    assert spark_peaks(week_html, "trends")[1] == str(max(week.done))
    assert "<th>done/h</th>" in week_html
