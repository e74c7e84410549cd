"""The operator's dashboard in a real headless Chromium, served by a real ``asyncq
dashboard`` process, with real worker processes (`tests.harness`): every page clicked
through on a phone's width and in another time zone, each bulk action with its preview,
and the live refresh with its pause toggle. Skipped, saying why, without Debian's
chromium (/usr/bin/chromium) or the playwright package.

With ``$ASYNCQ_SCREENSHOTS`` set to a folder, the pages are saved there as PNG."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from tests.dashboard.conftest import Serve, needs_the_extra
from tests.dashboard.test_browser import screenshot
from tests.harness.jobs import insert_jobs
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

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

pytestmark = pytest.mark.browser
UNTIL_FIXED = "guarded.until_fixed"
DOOMED = "guarded.doomed"
ZONE = "Asia/Tokyo"
PHONE = {"width": 375, "height": 740}


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        try:
            yield launched
        finally:
            launched.close()


def statuses(db: psycopg.Connection[Any], ids: list[int]) -> list[str]:
    rows = db.execute(
        "SELECT status::text FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def column(db: psycopg.Connection[Any], name: str, ids: list[int]) -> list[Any]:
    rows = db.execute(
        f"SELECT {name} FROM asyncq_jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    return [r[0] for r in rows]


def fits(page: Any) -> None:
    """Nothing on the page is wider than the window: wide tables scroll in their box."""
    width = page.evaluate("() => document.documentElement.scrollWidth")
    wider = page.evaluate(
        """w => Array.from(document.querySelectorAll('body *'))
               .filter(e => e.getBoundingClientRect().right > w && !e.closest('.scroll'))
               .map(e => e.tagName + '#' + e.id + '.' + e.className)""",
        page.viewport_size["width"],
    )
    assert width <= page.viewport_size["width"], (page.url, width, wider)


def test_click_through_every_page_on_a_phone_in_another_time_zone(
    serve: Serve, browser: Any, workers: Workers, db: psycopg.Connection[Any]
) -> None:
    dashboard = serve()
    doomed = insert_jobs(db, DOOMED, [{"token": f"card-{n}"} for n in range(3)], queue="mail")
    done = insert_jobs(db, "tests.harness.app.noop", [{"n": n} for n in range(2)])
    worker = workers.start()
    wait_until(lambda: statuses(db, doomed) == ["failed"] * 3, 30, "the doomed jobs to fail")
    wait_until(lambda: statuses(db, done) == ["done"] * 2, 30, "the others to end done")
    db.execute(
        "INSERT INTO asyncq_schedules (name, task_name, cron, tz, last_slot, last_job_id)"
        " VALUES ('nightly', 'tests.harness.app.noop', '0 3 * * *', 'UTC', now(), %s)",
        (done[0],),
    )
    page = browser.new_context(viewport=PHONE, timezone_id=ZONE).new_page()
    page.goto(dashboard + "/")
    assert page.title() == "Queues · asyncq"
    assert page.inner_text("#time-zone") == f"times in {ZONE}"
    fits(page)

    page.click("header >> text=Workers")
    assert page.title() == "Workers · asyncq"
    row = page.locator("#workers tbody tr")
    assert row.count() == 1
    shown = row.first.inner_text()
    assert str(worker.pid) in shown and "live" in shown and "every queue" in shown
    fits(page)
    screenshot(page, "workers")

    page.click("header >> text=Schedules")
    assert page.title() == "Schedules · asyncq"
    schedule = page.locator("#schedules tbody tr").first.inner_text()
    assert "nightly" in schedule and "done" in schedule
    fits(page)

    page.click("header >> text=Failed")
    assert page.title() == "Failed jobs · asyncq"
    assert page.locator("#jobs tbody tr").count() == 3
    page.fill("form.filters:not(.bulk) input[name=text]", "CARD-1")
    page.click("form.filters:not(.bulk) button")
    assert page.inner_text("#shown").startswith("1 of 1 shown")
    fits(page)
    # A date in the list is on one line, in the viewer's time zone (the UTC one its title).
    when = page.locator("#jobs time").first
    utc = datetime.fromisoformat(when.get_attribute("datetime"))
    assert when.inner_text() == f"{utc.astimezone(ZoneInfo(ZONE)):%Y-%m-%d %H:%M:%S}"
    assert when.get_attribute("title", timeout=1000).endswith(" UTC")
    lines = page.evaluate(
        """() => Array.from(document.querySelectorAll('#jobs .when')).map(e => {
               const r = document.createRange(); r.selectNodeContents(e);
               return new Set(Array.from(r.getClientRects()).map(x => x.top)).size; })"""
    )
    assert lines and set(lines) == {1}, lines
    screenshot(page, "phone-jobs")

    page.locator("#jobs tbody tr a").first.click()
    assert page.title() == f"Job {doomed[1]} · {DOOMED} (failed) · asyncq"
    attempts = page.locator("#attempts li")
    assert attempts.count() == 3, page.inner_text("#attempts")  # the table's max_attempts
    for n in (0, 1):
        shown = attempts.nth(n).inner_text()
        assert shown.startswith("retried") and f"attempt {n + 1}" in shown
    last = attempts.nth(2).inner_text()
    assert last.startswith("failed") and "attempt 3" in last and worker_id(db) in last
    assert "gateway rejected the request" in page.inner_text("#attempts")
    assert page.inner_text("#wait-time") != "-" and page.inner_text("#run-time") != "-"
    fits(page)
    screenshot(page, "phone-job")

    page.click("header >> text=Audit")
    assert page.title() == "Audit · asyncq"
    assert "No bulk action has been run" in page.inner_text("main")
    fits(page)
    icon = page.request.get(dashboard + "/favicon.svg")
    assert icon.status == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert page.locator("link[rel=icon]").get_attribute("href") == "/favicon.svg"


def worker_id(db: psycopg.Connection[Any]) -> str:
    row = db.execute("SELECT id FROM asyncq_workers").fetchone()
    assert row is not None
    return str(row[0])


def bulk(page: Any, action: str, **values: str) -> int:
    """From the jobs list on the page: choose ``action`` for the filtered set, preview it,
    confirm it, and see its audit record end done; returns the count the preview said
    would change."""
    page.select_option("#bulk-action", action)
    for name, value in values.items():
        page.fill(f"#bulk input[name={name}]", value)
    with page.expect_navigation():
        page.click("#bulk-preview")
    assert page.title() == f"Preview: {action} · asyncq", page.content()[:600]
    changes = int(page.inner_text("#would-change"))
    with page.expect_navigation():
        page.click("#bulk-confirm")
    assert "the bulk action runs" in page.inner_text(".notice")

    def ended() -> bool:
        page.reload()
        return page.locator("#audit tr.marked td.audit-state").inner_text() == "done"

    wait_until(ended, 30, f"the {action} to end done")
    marked = page.locator("#audit tr.marked").inner_text()
    assert action in marked and "local" in marked
    return changes


def jobs_list(page: Any, dashboard: str, **filters: str) -> None:
    page.goto(dashboard + "/jobs")
    for name, value in filters.items():
        if name == "status":
            page.select_option("form.filters:not(.bulk) select[name=status]", value)
        else:
            page.fill(f"form.filters:not(.bulk) input[name={name}]", value)
    with page.expect_navigation():
        page.click("form.filters:not(.bulk) button")


def test_each_bulk_action_with_its_preview(
    serve: Serve, browser: Any, workers: Workers, db: psycopg.Connection[Any]
) -> None:
    dashboard = serve()
    failing = insert_jobs(db, UNTIL_FIXED, [{"token": f"t{n}"} for n in range(4)], max_attempts=1)
    workers.start()  # without $HARNESS_FIXED: each fails
    wait_until(lambda: statuses(db, failing) == ["failed"] * 4, 30, "the jobs to fail")
    workers.stop_all()
    page = browser.new_page(viewport={"width": 1280, "height": 800})

    jobs_list(page, dashboard, status="failed", task="guarded.until")
    assert page.locator("#jobs tbody tr").count() == 4
    assert bulk(page, "requeue") == 4
    assert statuses(db, failing) == ["queued"] * 4
    screenshot(page, "audit")
    workers.start(env=workers.env(HARNESS_FIXED="1"))
    wait_until(lambda: statuses(db, failing) == ["done"] * 4, 30, "the requeued jobs to end done")
    workers.stop_all()

    db.execute("INSERT INTO asyncq_queues (name, paused_at) VALUES ('parked', now())")
    parked = insert_jobs(db, "tests.harness.app.noop", [{"n": n} for n in range(5)], queue="parked")
    jobs_list(page, dashboard, queue="parked")
    assert page.inner_text("#shown").startswith("5 of 5 shown")
    assert bulk(page, "priority", priority="7") == 5
    assert column(db, "priority", parked) == [7] * 5

    jobs_list(page, dashboard, queue="parked")
    assert bulk(page, "move", to_queue="parked-too") == 5
    assert column(db, "queue", parked) == ["parked-too"] * 5

    jobs_list(page, dashboard, queue="parked-too")
    page.select_option("#bulk-action", "cancel")
    with page.expect_navigation():
        page.click("#bulk-preview")
    assert "5 jobs match the filter" in page.inner_text("#preview-count")
    page.go_back()
    assert bulk(page, "cancel") == 5
    assert statuses(db, parked) == ["cancelled"] * 5

    jobs_list(page, dashboard, queue="parked-too", status="cancelled")
    assert bulk(page, "delete") == 5
    assert statuses(db, parked) == []

    page.click("header >> text=Audit")
    rows = page.locator("#audit tbody tr")
    assert [rows.nth(i).locator("td").nth(3).inner_text().split(" ")[0] for i in range(5)] == [
        "delete",
        "cancel",
        "move",
        "priority",
        "requeue",
    ]
    assert rows.nth(4).locator("td").nth(6).inner_text() == "4"


def test_the_lists_refresh_on_their_own_until_paused(
    serve: Serve, browser: Any, db: psycopg.Connection[Any]
) -> None:
    dashboard = serve()
    db.execute("INSERT INTO asyncq_queues (name, paused_at) VALUES ('live', now())")
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(dashboard + "/jobs?queue=live")
    rows = page.locator("#jobs tbody tr")
    assert rows.count() == 0 and "No jobs match" in page.inner_text("#list")
    assert page.inner_text("#live-toggle") == "Live: on"

    insert_jobs(db, "tests.harness.app.noop", [{}], queue="live")
    wait_until(lambda: rows.count() == 1, 30, "the empty list to show a job without a reload")
    insert_jobs(db, "tests.harness.app.noop", [{}], queue="live")
    wait_until(lambda: rows.count() == 2, 30, "the list to show the new job without a reload")
    assert page.inner_text("#shown").startswith("2 of 2 shown")

    page.click("#live-toggle")
    assert page.inner_text("#live-toggle") == "Live: paused"
    insert_jobs(db, "tests.harness.app.noop", [{}], queue="live")
    page.wait_for_timeout(7000)  # more than a refresh's interval: none came
    assert rows.count() == 2
    page.reload()  # the pause holds across pages
    assert page.inner_text("#live-toggle") == "Live: paused" and rows.count() == 3
    insert_jobs(db, "tests.harness.app.noop", [{}], queue="live")
    page.click("#live-toggle")
    assert page.inner_text("#live-toggle") == "Live: on"
    wait_until(lambda: rows.count() == 4, 30, "the list to refresh once resumed")


def test_a_jobs_page_follows_its_attempts_and_progress_live(
    serve: Serve, browser: Any, workers: Workers, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    dashboard = serve()
    gate = tmp_path / "gate"
    [job] = insert_jobs(db, "tests.harness.app.reporting", [{"fail_first": 1, "gate": str(gate)}])
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{dashboard}/jobs/{job}")
    assert page.inner_text("#status") == "queued" and page.locator("#attempts").count() == 0
    loaded = page.evaluate("() => performance.timeOrigin")

    workers.start()

    def shown(selector: str, text: str) -> bool:
        found = page.locator(selector)
        return bool(found.count() and text in found.inner_text())

    wait_until(lambda: shown("#progress", "half of attempt 1"), 30, "the first report")
    assert page.inner_text("#status") == "running" and shown("#progress", "50%")
    assert shown("#attempts", "running") and shown("#attempts", "attempt 1")
    gate.touch()
    wait_until(lambda: shown("#status", "done"), 30, "the page to show the job done")
    attempts = page.locator("#attempts li")
    assert attempts.count() == 2
    first = attempts.nth(0)
    assert "retried" in first.inner_text() and "attempt 1 fails on purpose" in first.inner_text()
    first.locator("details.attempt-logs summary").click()
    assert "attempt 1 starts" in first.locator("details.attempt-logs pre").inner_text()
    assert "done" in attempts.nth(1).inner_text()
    assert shown("#progress", "100%") and shown("#progress", "done")
    # What the reader unfolded stays open across refreshes.
    refreshed = page.evaluate("() => document.documentElement.dataset.refreshed")
    wait_until(
        lambda: page.evaluate("() => document.documentElement.dataset.refreshed") != refreshed,
        30,
        "another refresh",
    )
    assert page.locator("#attempts li").nth(0).locator("details.attempt-logs[open]").count() == 1
    # All of it without a reload.
    assert page.evaluate("() => performance.timeOrigin") == loaded
