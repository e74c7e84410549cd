"""The dashboard in a real headless Chromium, served by a real ``asyncq dashboard``
process, with real worker processes (`tests.harness`): a failed job found, requeued and
seen done; hostile values that must not run. Skipped, saying why, without Debian's
chromium (/usr/bin/chromium) or the playwright package.

With ``$ASYNCQ_SCREENSHOTS`` set to a folder, the walk-through saves the main pages
there as PNG (docs/screenshots holds the ones docs/how-to/operate.md shows)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.dashboard.conftest import Serve, needs_the_extra
from tests.harness.jobs import insert_jobs
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until
from tests.harness.workflow_app import APP as WORKFLOW_APP
from tests.harness.workflow_app import emit, released, shipped

CHROMIUM = Path("/usr/bin/chromium")

needs_the_extra()
if not CHROMIUM.exists():
    pytest.skip(
        f"no {CHROMIUM}: the browser tests need Debian's chromium (apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the browser tests need playwright (pip install playwright)"
)

UNTIL_FIXED = "guarded.until_fixed"
SCRIPT = "<script>window.pwned = 1; alert('script')</script>"
IMG = "<img src=x onerror=\"window.pwned = 2; alert('img')\">"
HOSTILE = SCRIPT + IMG

pytestmark = pytest.mark.browser


@pytest.fixture
def dashboard(serve: Serve) -> str:
    """``asyncq dashboard`` as its own process on a free port; its base URL."""
    return serve()


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 800})
        finally:
            browser.close()


def status_of(db: psycopg.Connection[Any], job_id: int) -> str:
    # Its status alone: a waiting job's run_at may be 'infinity', beyond Python's datetime.
    row = db.execute("SELECT status::text FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def screenshot(page: Any, name: str) -> None:
    folder = os.environ.get("ASYNCQ_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def test_find_a_failed_job_requeue_it_and_see_it_done(
    dashboard: str, page: Any, workers: Workers, db: psycopg.Connection[Any]
) -> None:
    insert_jobs(db, "tests.harness.app.noop", [{"n": n} for n in range(5)], queue="mail")
    [failing] = insert_jobs(db, UNTIL_FIXED, [{"token": "invoice-17"}], max_attempts=1)
    worker = workers.start()  # without $HARNESS_FIXED: the task fails
    wait_until(lambda: status_of(db, failing) == "failed", 30, "the job to fail")
    workers.stop_all()

    page.goto(dashboard + "/")
    assert page.locator("#queues").inner_text().count("default") == 1
    screenshot(page, "queues")
    page.click("header >> text=Jobs")
    page.select_option("select[name=status]", "failed")
    page.click("form.filters:not(.bulk) button")
    rows = page.locator("#jobs tbody tr")
    assert rows.count() == 1
    assert UNTIL_FIXED in rows.first.inner_text()
    screenshot(page, "jobs")
    rows.first.locator("a").first.click()
    assert page.url == f"{dashboard}/jobs/{failing}"
    assert page.inner_text("#status") == "failed"
    assert "RuntimeError: not fixed yet" in page.inner_text("#error")
    assert "invoice-17" in page.inner_text("#args")
    screenshot(page, "job")

    page.click("#requeue")
    assert "Requeued" in page.inner_text(".notice")
    assert page.inner_text("#status") == "queued"
    assert status_of(db, failing) == "queued"

    workers.start(env=workers.env(HARNESS_FIXED="1"))

    def shown_done() -> bool:
        page.reload()
        return bool(page.inner_text("#status") == "done")

    wait_until(shown_done, 30, "the page to show the job done")
    assert worker.pid != workers.started[-1].pid


def test_hostile_values_do_not_run_in_the_browser(
    dashboard: str, page: Any, db: psycopg.Connection[Any]
) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    ids = insert_jobs(
        db,
        HOSTILE,
        [{HOSTILE: HOSTILE}],
        queue=HOSTILE,
        status="failed",
        last_error=f"{HOSTILE}\n{HOSTILE}",
        finished_at=db.execute("SELECT now()").fetchone()[0],  # type: ignore[index]
    )
    db.execute("UPDATE asyncq_jobs SET result = %s WHERE id = %s", (json.dumps(HOSTILE), ids[0]))
    # A step and a child of its own, named by the task's code: shown, and offered to retry from.
    db.execute(
        "INSERT INTO asyncq_steps (job_id, name, seq, result, attempt, claim)"
        " VALUES (%s, %s, 1, '1', 1, 1)",
        (ids[0], HOSTILE),
    )
    insert_jobs(db, HOSTILE, [{}], parent_id=ids[0])
    for path in ("/", "/jobs", "/jobs?status=failed", f"/jobs/{ids[0]}"):
        page.goto(dashboard + path)
        assert page.evaluate("window.pwned") is None, path
        assert page.locator("script").count() == 1 and page.locator("main img").count() == 0
        assert page.locator("script").get_attribute("src") == "/live.js"
    # The values are there, shown as text.
    assert page.inner_text("#task") == HOSTILE
    assert HOSTILE in page.inner_text("#error")
    assert page.inner_text("#steps td.step") == HOSTILE
    assert page.locator("#retry-step option").evaluate("o => o.value") == HOSTILE
    assert HOSTILE in page.inner_text("#children")
    assert dialogs == []


def test_walk_a_workflow_job_its_children_and_retry_it_from_a_step(
    dashboard: str, page: Any, workers: Workers, db: psycopg.Connection[Any], dsn: str
) -> None:
    [order] = insert_jobs(db, "flow.order", [{"order": 7, "items": 3}])
    workers.start(app=WORKFLOW_APP)
    wait_until(lambda: waiting_for(db, order) == "jobs", 30, "the order to gather its children")
    children = [
        row[0]
        for row in db.execute(
            "SELECT id FROM asyncq_jobs WHERE parent_id = %s ORDER BY id", (order,)
        )
    ]
    wait_until(lambda: all(waiting_for(db, c) for c in children), 30, "the children to wait")

    page.goto(dashboard + "/jobs")
    page.click(".tabs >> text=waiting")
    listed = page.locator("#jobs tbody tr")
    assert listed.count() == 4
    page.click(f"#jobs >> a[href='/jobs/{order}']")
    assert page.url == f"{dashboard}/jobs/{order}"
    assert page.inner_text("#status") == "waiting"
    assert "3 jobs to end" in page.inner_text("#waiting-for")
    assert page.locator("#steps tbody tr").count() == 2
    page.click(f"#children >> a[href='/jobs/{children[0]}']")
    assert page.url == f"{dashboard}/jobs/{children[0]}"
    assert "order-7.released" in page.inner_text("#waiting-for")
    page.click("#parent a")
    assert page.url == f"{dashboard}/jobs/{order}"

    assert emit(dsn, released(7)) and emit(dsn, shipped(7), "sent")

    def shown_done() -> bool:
        page.reload()
        return bool(page.inner_text("#status") == "done")

    wait_until(shown_done, 30, "the page to show the order done")
    steps = page.locator("#steps tbody tr")
    assert steps.count() == 5 and "notify" in steps.nth(4).inner_text()
    assert page.locator("#steps svg.bar").count() == 5
    # Every date on the page on one line, in a narrow window too.
    page.set_viewport_size({"width": 700, "height": 800})
    lines = page.evaluate(
        """() => Array.from(document.querySelectorAll('.when')).map(e => {
               const r = document.createRange(); r.selectNodeContents(e);
               return new Set(Array.from(r.getClientRects()).map(x => x.top)).size; })"""
    )
    assert lines and set(lines) == {1}, lines
    page.set_viewport_size({"width": 1280, "height": 800})
    screenshot(page, "workflow-job")

    claims = claims_of(db, order)
    page.select_option("#retry-step", "pack")
    page.click("#retry-from-step")
    assert "that step and every one recorded after it run again" in page.inner_text(".notice")
    wait_until(
        lambda: status_of(db, order) == "done" and claims_of(db, order) > claims,
        30,
        "the order to end again",
    )
    ran = {step: len(workers.ledger.events(step, order)) for step in ("charge", "pack", "notify")}
    assert ran == {"charge": 1, "pack": 2, "notify": 2}
    wait_until(shown_done, 30, "the page to show the order done again")


def waiting_for(db: psycopg.Connection[Any], job_id: int) -> str | None:
    row = db.execute(
        "SELECT waiting_for FROM asyncq_jobs WHERE id = %s AND status = 'waiting'", (job_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def claims_of(db: psycopg.Connection[Any], job_id: int) -> int:
    row = db.execute("SELECT claims FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return int(row[0])
