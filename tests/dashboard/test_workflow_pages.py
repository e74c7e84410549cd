"""The dashboard's pages and actions for work that spans jobs, on jobs that real worker
processes ran (`tests.harness.workflow_app`): a job's steps, parent, children,
dependencies and what it waits for; waiting jobs in the listings and the counts; Retry
and Retry from step, behind the CSRF token, hidden and refused when read-only."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
import psycopg
import pytest

import asyncq
from tests.dashboard.conftest import client_for, csrf_token, needs_the_extra, status_of
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import until
from tests.harness.workflow_app import APP, released, shipped

needs_the_extra()
pytestmark = pytest.mark.anyio


def defer(db: psycopg.Connection[Any], task: str, **args: Any) -> int:
    row = db.execute(
        "INSERT INTO asyncq_jobs (task_name, args) VALUES (%s, %s) RETURNING id",
        (task, psycopg.types.json.Jsonb(args)),
    ).fetchone()
    assert row is not None
    return int(row[0])


def waiting_for(db: psycopg.Connection[Any], job_id: int) -> str | None:
    row = db.execute(
        "SELECT waiting_for FROM asyncq_jobs WHERE id = %s AND status = 'waiting'", (job_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def ids_of(db: psycopg.Connection[Any], where: str, *params: Any) -> list[int]:
    query = f"SELECT id FROM asyncq_jobs WHERE {where} ORDER BY id"
    return [int(row[0]) for row in db.execute(query, params)]  # type: ignore[arg-type]


def section(page: str, element_id: str) -> str:
    """The element of ``page`` with that id, up to its closing tag (no nesting of its own
    kind inside: a table, a paragraph, a definition)."""
    start = page.index(f'id="{element_id}"')
    tag = page[page.rindex("<", 0, start) + 1 : start].split()[0]
    return page[start : page.index(f"</{tag}>", start)]


def links(fragment: str) -> list[int]:
    return [int(i) for i in re.findall(r'<a href="/jobs/(\d+)">', fragment)]


def steps_shown(page: str) -> list[tuple[str, str]]:
    rows = re.findall(
        r'<td class="step">([^<]*)</td>.*?class="status status-\w+">(\w+)<',
        section(page, "steps"),
        flags=re.S,
    )
    return [(html.unescape(name), status) for name, status in rows]


async def test_a_workflow_jobs_page_shows_its_steps_children_dependencies_and_waits(
    client: httpx.AsyncClient, db: psycopg.Connection[Any], workers: Workers
) -> None:
    order = defer(db, "flow.order", order=1, items=3)
    nap = defer(db, "flow.nap", seconds=3600)
    batch = defer(db, "flow.batch", order=2, parts=2)
    workers.start(app=APP)
    await until(lambda: waiting_for(db, order) == "jobs", what="the order to gather")
    await until(lambda: status_of(db, batch) == "done", what="the batch to defer its parts")
    children = ids_of(db, "parent_id = %s", order)
    parts = ids_of(db, "task_name = 'flow.item' AND args->>'order' = %s", "2")
    [callback] = ids_of(db, "task_name = 'flow.callback'")
    waiting = sorted({order, nap, callback, *children, *parts})
    await until(lambda: all(waiting_for(db, i) for i in waiting), what="every job to wait")

    page = (await client.get(f"/jobs/{order}")).text
    assert 'id="status" class="status status-waiting">waiting<' in page
    shown = section(page, "waiting-for")
    assert "3 jobs to end:" in shown and links(shown) == children
    assert steps_shown(page) == [("charge", "done"), ("asyncq.spawn:flow.item", "done")]
    assert links(section(page, "children")) == children
    assert section(page, "children-summary").endswith(">3: 3 waiting")
    assert "<th>due at</th>" not in page  # nothing but its children wakes it
    assert 'id="cancel"' in page and 'id="retry"' not in page

    child = (await client.get(f"/jobs/{children[0]}")).text
    assert links(section(child, "parent")) == [order]
    assert f"the event <code>{released(1)}</code>, with no timeout" in section(child, "waiting-for")

    slept = (await client.get(f"/jobs/{nap}")).text
    sleeps = r'a sleep, until <span class="when"><time datetime="[^"]+">\d{4}-\d\d-\d\d [\d:]+ UTC'
    assert re.search(sleeps, slept)
    assert "<th>due at</th>" in slept
    assert steps_shown(slept) == [("asyncq.sleep", "waiting")]
    assert '<svg class="bar"' in section(slept, "steps")

    after = (await client.get(f"/jobs/{callback}")).text
    assert links(section(after, "after")) == parts
    assert "(on parent failure: run)" in section(after, "after")
    assert "2 jobs it runs after to end:" in section(after, "waiting-for")
    assert links(section(after, "waiting-for")) == parts

    listed = (await client.get("/jobs?status=waiting")).text
    assert sorted(links(section(listed, "jobs"))) == waiting
    assert '<span class="waiting-for">sleep</span>' in listed
    assert '<a href="/jobs?status=waiting" class="current">waiting</a>' in listed
    everything = await client.get("/jobs")
    assert everything.status_code == 200  # a run_at of 'infinity' is shown as none
    assert set(waiting) <= set(links(section(everything.text, "jobs")))

    queues = (await client.get("/")).text
    default = section(queues, "queues")
    assert f'status=waiting">{len(waiting)}</a>' in default
    assert '<th class="num">waiting</th>' in section(queues, "states")
    assert f'status=waiting">{len(waiting)}</a>' in section(queues, "states")
    metrics = (await client.get("/metrics")).text
    assert f'asyncq_queue_jobs{{queue="default",state="waiting"}} {len(waiting)}' in metrics
    assert 'asyncq_queue_jobs{queue="default",state="failed"} 0' in metrics


async def ended_order(
    app: asyncq.App, db: psycopg.Connection[Any], workers: Workers, number: int
) -> int:
    """An order that ran to its end: five steps recorded, two children."""
    order = defer(db, "flow.order", order=number, items=2)
    workers.start(app=APP)
    await until(lambda: waiting_for(db, order) == "jobs", what="the order to gather")
    assert await app.emit_event(released(number))
    assert await app.emit_event(shipped(number), "sent")
    await until(lambda: status_of(db, order) == "done", what="the order to end")
    return order


def claims_of(db: psycopg.Connection[Any], job_id: int) -> int:
    row = db.execute("SELECT claims FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_retry_and_retry_from_a_step_on_the_job_page(
    client: httpx.AsyncClient,
    app: asyncq.App,
    db: psycopg.Connection[Any],
    workers: Workers,
    ledger: Ledger,
) -> None:
    order = await ended_order(app, db, workers, 5)
    page = (await client.get(f"/jobs/{order}")).text
    assert 'id="retry"' in page and 'id="cancel"' not in page
    options = re.findall(r'<option value="([^"]*)">', section(page, "retry-step"))
    assert [html.unescape(o) for o in options] == [
        "charge",
        "asyncq.spawn:flow.item",
        "pack",
        f"asyncq.wait:{shipped(5)}",
        "notify",
    ]
    token = csrf_token(page)

    def ran(step: str) -> int:
        return len(ledger.events(step, order))

    claims = claims_of(db, order)
    retried = await client.post(f"/jobs/{order}/retry", data={"csrf": token, "step": "pack"})
    assert retried.status_code == 303
    assert retried.headers["location"] == f"/jobs/{order}?notice=retried-from-step"
    assert (
        "that step and every one recorded after it run again"
        in (await client.get(retried.headers["location"])).text
    )
    await until(
        lambda: status_of(db, order) == "done" and claims_of(db, order) > claims,
        what="the order to end again",
    )
    assert (ran("charge"), ran("pack"), ran("notify")) == (1, 2, 2)

    claims = claims_of(db, order)
    whole = await client.post(f"/jobs/{order}/retry", data={"csrf": token})
    assert whole.headers["location"] == f"/jobs/{order}?notice=retried"
    await until(
        lambda: status_of(db, order) == "done" and claims_of(db, order) > claims,
        what="the order to end once more",
    )
    assert (ran("charge"), ran("pack"), ran("notify")) == (1, 2, 2)

    nap = defer(db, "flow.nap", seconds=3600)
    await until(lambda: waiting_for(db, nap) == "sleep", what="the nap to sleep")
    for job_id, form in (
        (order, {"step": "nope"}),  # no such step
        (nap, {}),  # not ended
        (10**9, {}),  # no such job
    ):
        refused = await client.post(f"/jobs/{job_id}/retry", data={"csrf": token, **form})
        assert refused.headers["location"] == f"/jobs/{job_id}?notice=not-retried", job_id
    assert status_of(db, order) == "done" and status_of(db, nap) == "waiting"

    # Only with the page's token, from the dashboard's own pages.
    for form, headers in (
        ({}, {}),
        ({"csrf": "0" * 64}, {}),
        ({"csrf": token}, {"origin": "http://evil.test"}),
    ):
        forged = await client.post(
            f"/jobs/{order}/retry", data={**form, "step": "charge"}, headers=headers
        )
        assert forged.status_code == 403, (form, headers)
    assert status_of(db, order) == "done" and ran("charge") == 1


async def test_read_only_hides_retry_and_refuses_it(
    app: asyncq.App, db: psycopg.Connection[Any], workers: Workers
) -> None:
    from asyncq.dashboard import create_app

    order = await ended_order(app, db, workers, 6)
    claims = claims_of(db, order)
    async with client_for(create_app(app)) as writable:
        page = (await writable.get(f"/jobs/{order}")).text
        assert 'id="retry"' in page and 'id="retry-from-step"' in page
        token = csrf_token(page)
        cookies = writable.cookies
    async with client_for(create_app(app, read_only=True)) as client:
        page = (await client.get(f"/jobs/{order}")).text
        assert "<form" not in page and "<button" not in page and "<select" not in page
        assert 'id="steps"' in page  # what it shows stays
        client.cookies.update(cookies)
        for form in ({}, {"step": "pack"}):
            refused = await client.post(f"/jobs/{order}/retry", data={"csrf": token, **form})
            assert refused.status_code == 403 and "read-only" in refused.text
    assert status_of(db, order) == "done" and claims_of(db, order) == claims
