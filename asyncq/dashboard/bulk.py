"""Bulk actions on the jobs a filter finds: a preview that says how many jobs match and
how many the action would change, a confirmation that starts it in the background of the
dashboard's process (batches, each counted in its audit record as it commits), and the
audit page that lists every one run (who, what, the filter, the rows so far, its state)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from asyncq import admin, pools
from asyncq.dashboard import listing
from asyncq.dashboard.guard import IDENTITY, LOCAL

if TYPE_CHECKING:
    from asyncq.app import App
    from asyncq.dashboard.app import Dashboard

logger = logging.getLogger(__name__)

AUDIT_SHOWN = 200


class BadAction(ValueError):
    """A bulk action's form the dashboard refuses (400)."""


def _action(form: dict[str, str]) -> tuple[admin.BulkAction, int | None, str | None]:
    """The action a form asks for, with its value (a priority, a queue)."""
    name = form.get("action", "")
    if name not in admin.BULK_ACTIONS:
        raise BadAction(f"the action is one of {', '.join(admin.BULK_ACTIONS)}")
    priority = queue = None
    if name == "priority":
        text = form.get("priority", "").strip()
        try:
            priority = int(text)
        except ValueError:
            raise BadAction("a new priority is a whole number") from None
        if abs(priority) >= 2**31:
            raise BadAction("a priority fits in 32 bits")
    if name == "move":
        queue = form.get("to_queue", "").strip()
        if not queue:
            raise BadAction("moving jobs needs the queue to move them to")
    return admin.BULK_ACTIONS[name], priority, queue


class Bulk:
    """The bulk action routes of a `Dashboard`."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.running: set[asyncio.Task[admin.BulkResult]] = set()

    @property
    def app(self) -> App:
        return self.dashboard.app

    async def preview(self, request: Request) -> Response:
        """How many jobs the filter finds and how many the action would change; a form
        to confirm it (the filter fixed: an absolute window, the highest id counted)."""
        form = await self.dashboard.checked_form(request)
        if isinstance(form, Response):
            return form
        now = datetime.now(UTC)
        found = listing.read(form, now=now)
        action, priority, queue = _action(form)
        async with pools.connection(self.app.pool) as conn:
            up_to = await admin.newest_id(conn, self.app.store)
            # No job at all: nothing to count up to, and nothing the action could change.
            fixed = listing.read(found.fixed(now, up_to or None), now=now)
            counted = await admin.count_matching(
                conn, self.app.store, fixed.where, eligible=action.eligible
            )
        return self.dashboard.render(
            request,
            "bulk_preview.html",
            action=action,
            priority=priority,
            to_queue=queue,
            filter=fixed,
            counted=counted,
            back=found.query(),
        )

    async def run(self, request: Request) -> Response:
        """The action confirmed: its audit record written, then run in batches by a
        task of this process while the answer points at the record."""
        form = await self.dashboard.checked_form(request)
        if isinstance(form, Response):
            return form
        found = listing.read(form, now=datetime.now(UTC))
        if found.where.up_to is None:
            raise BadAction("a bulk action runs on the jobs its preview counted: preview it first")
        action, priority, queue = _action(form)
        matched = int(form.get("matched", "0")) if form.get("matched", "").isdigit() else 0
        started = await admin.start_bulk(
            lambda: pools.connection(self.app.pool),
            self.app.store,
            action.name,
            found.where,
            actor=str(request.scope.get(IDENTITY, LOCAL)),
            priority=priority,
            queue=queue,
            matched=matched,
        )
        task = asyncio.create_task(started.run())
        self.running.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._ended)
        root = request.scope.get("root_path", "")
        return RedirectResponse(
            f"{root}/audit?notice=bulk-started&record={started.audit_id}", status_code=303
        )

    async def stop(self) -> None:
        """Stop the actions still running, the process shutting down: each ends its
        batch under way rolled back, its record written stopped."""
        for task in self.running:
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)

    def _ended(self, task: asyncio.Task[admin.BulkResult]) -> None:
        self.running.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Its audit record says failed, with the error; the traceback goes to the log.
            logger.error("a bulk action failed", exc_info=exc)

    async def audit_page(self, request: Request) -> Response:
        async with pools.connection(self.app.pool) as conn:
            records = await admin.audit(conn, self.app.store, limit=AUDIT_SHOWN)
        marked = request.query_params.get("record", "")
        return self.dashboard.render(
            request, "audit.html", records=records, marked=marked, shown=AUDIT_SHOWN
        )
