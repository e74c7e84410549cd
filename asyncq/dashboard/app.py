"""The dashboard's ASGI app: pages that read through `asyncq.admin`, and actions that
write through it, only by POST with a CSRF token."""

from __future__ import annotations

import contextlib
import importlib.resources
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from markupsafe import Markup
from psycopg import errors
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from asyncq import admin, display, pools
from asyncq.app import App
from asyncq.dashboard import chart, listing, metrics
from asyncq.dashboard.bulk import BadAction, Bulk
from asyncq.dashboard.csrf import FIELD, Csrf
from asyncq.dashboard.guard import Authorize, Guard
from asyncq.dashboard.hosts import AllowedHosts
from asyncq.dashboard.login import Login
from asyncq.errors import JobNotFound, PreparedStatementsRefused, SchemaNotMigrated

CHART_MINUTES = 60
# The windows the queues page offers for each queue's trends: minutes, and minutes a point.
WINDOWS = {"1h": (60, 1), "24h": (24 * 60, 15), "7d": (7 * 24 * 60, 60)}
MAX_FORM_BYTES = 16384  # a bulk action's form carries its filter

NOTICES = {
    "requeued": "Requeued: the job waits for a worker.",
    "not-requeued": "Not requeued: only a failed or cancelled job can be.",
    "cancelled": "Cancelled.",
    "aborting": "Cancelling: its worker stops it and writes it cancelled.",
    "not-cancelled": "Not cancelled: the job had ended already.",
    "retried": "Queued again: the steps it finished keep their results.",
    "retried-from-step": "Queued again: that step and every one recorded after it run again.",
    "not-retried": "Not retried: only a job that ended can run again, from a step it has.",
    "paused": "Paused: no worker claims from this queue now.",
    "already-paused": "The queue was paused already.",
    "resumed": "Resumed: workers claim from this queue again.",
    "not-paused": "The queue was not paused.",
    "bulk-started": "Started: the bulk action runs; its record, marked below, counts the rows"
    " it has changed as it goes.",
}

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("asyncq.dashboard", "templates"),
    autoescape=True,  # every value on a page is data: task names, arguments, errors
    undefined=jinja2.StrictUndefined,
)


def _when(moment: datetime | None) -> Markup | str:
    """A moment as a <time> element: in UTC on the page, in the viewer's own time zone
    once live.js has run."""
    if moment is None:
        return "-"
    utc = moment.astimezone(UTC)
    return Markup('<time datetime="{}">{:%Y-%m-%d %H:%M:%S} UTC</time>').format(
        utc.isoformat(), utc
    )


_templates.filters["when"] = _when
_templates.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False)
_templates.filters["took"] = display.duration
_templates.filters["age"] = display.age
_templates.filters["size"] = lambda v: "-" if v is None else display.size(v)
_FILES = importlib.resources.files("asyncq.dashboard")
_STYLE = (_FILES / "style.css").read_text()
_SCRIPT = (_FILES / "live.js").read_text()
_ICON = (_FILES / "favicon.svg").read_text()

Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    """A query or form value the dashboard refuses (400)."""


class Dashboard:
    """The routes; one per page or action."""

    def __init__(self, app: App, *, read_only: bool, csrf: Csrf) -> None:
        self.app = app
        self.read_only = read_only
        self.csrf = csrf
        self.bulk = Bulk(self)

    def routes(self) -> list[Route]:
        return [
            Route("/", self.queues_page, name="queues"),
            Route("/jobs", self.jobs_page, name="jobs"),
            Route("/workers", self.workers_page, name="workers"),
            Route("/schedules", self.schedules_page, name="schedules"),
            Route("/jobs/{job_id:int}", self.job_page, name="job"),
            Route("/jobs/{job_id:int}/requeue", self.action(self.requeue), methods=["POST"]),
            Route("/jobs/{job_id:int}/cancel", self.action(self.cancel), methods=["POST"]),
            Route("/jobs/{job_id:int}/retry", self.action(self.retry), methods=["POST"]),
            Route("/jobs/bulk/preview", self.bulk.preview, methods=["POST"]),
            Route("/jobs/bulk/run", self.bulk.run, methods=["POST"]),
            Route("/audit", self.bulk.audit_page, name="audit"),
            Route("/queues/pause", self.action(self.pause), methods=["POST"]),
            Route("/queues/resume", self.action(self.resume), methods=["POST"]),
            Route("/metrics", self.metrics),
            Route("/style.css", self.style),
            Route("/live.js", self.script),
            Route("/favicon.svg", self.icon),
        ]

    # -- pages ---------------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        nonce, new = self.csrf.nonce(request)
        notice = NOTICES.get(request.query_params.get("notice", ""))
        html = _templates.get_template(template).render(
            base=request.scope.get("root_path", ""),
            read_only=self.read_only,
            csrf_field=FIELD,
            csrf_token=self.csrf.token(nonce),
            notice=notice,
            statuses=admin.STATUSES,
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if new:
            self.csrf.set_cookie(request, response, nonce)
        return response

    async def queues_page(self, request: Request) -> Response:
        window = request.query_params.get("window", "1h")
        if window not in WINDOWS:
            window = "1h"
        minutes, per = WINDOWS[window]
        async with pools.connection(self.app.pool) as conn, conn.transaction():
            # One snapshot and one now() for every number on the page: the done of the
            # last hour, the charts and the counts by state agree.
            await self.app.store.read_snapshot(conn)
            queues = await admin.queues(conn, self.app.store)
            history = await admin.queue_history(conn, self.app.store, minutes=minutes, per=per)
            stats = await admin.stats(conn, self.app.store, minutes=CHART_MINUTES)
            schedules = await admin.schedules(conn, self.app.store, self.app.schedules.values())
        limits = [lim for lim in await self.app.limits() if _limited(lim)]
        drawn = chart.throughput(stats.throughput, now=stats.now, minutes=CHART_MINUTES)
        # The queues listed first, then those whose jobs are all gone but not their samples.
        names = [q.name for q in queues if q.name in history]
        names += [name for name in history if name not in names]
        trends = {name: chart.trends(history[name]) for name in names}
        return self.render(
            request,
            "queues.html",
            queues=queues,
            stats=stats,
            chart=drawn,
            trends=trends,
            window=window,
            per=per,
            windows=list(WINDOWS),
            spark_width=chart.SPARK_WIDTH,
            spark_height=chart.SPARK_HEIGHT,
            schedules=schedules,
            limits=limits,
        )

    async def jobs_page(self, request: Request) -> Response:
        query = request.query_params
        found = listing.read(query, now=datetime.now(UTC))
        page = listing.page_number(query.get("page"))
        offset = (page - 1) * listing.PAGE
        async with pools.connection(self.app.pool) as conn:
            jobs = await admin.search_jobs(
                conn, self.app.store, found.where, limit=listing.PAGE, offset=offset
            )
            counted = await admin.count_matching(
                conn, self.app.store, found.where, at_most=listing.COUNTED
            )
        others = found.without("status")
        tabs = [("all", urlencode(others), found.where.status is None)] + [
            (s, urlencode({**others, "status": s}), s == found.where.status) for s in admin.STATUSES
        ]
        pages = -(-counted.found // listing.PAGE)
        return self.render(
            request,
            "jobs.html",
            jobs=jobs,
            filter=found,
            filters=found.given,
            tabs=tabs,
            counted=counted,
            page=page,
            pages=min(pages, listing.MAX_PAGE),
            first=offset + 1,
            windows=list(listing.WINDOWS),
            actions=admin.BULK_ACTIONS,
        )

    async def workers_page(self, request: Request) -> Response:
        async with pools.connection(self.app.pool) as conn:
            found = await admin.workers(conn, self.app.store)
        return self.render(
            request,
            "workers.html",
            workers=found,
            live=[w for w in found if w.alive],
            dead=[w for w in found if not w.alive],
        )

    async def schedules_page(self, request: Request) -> Response:
        async with pools.connection(self.app.pool) as conn:
            found = await admin.schedules(conn, self.app.store, self.app.schedules.values())
        return self.render(request, "schedules.html", schedules=found)

    async def job_page(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        async with pools.connection(self.app.pool) as conn:
            found = await admin.job(conn, self.app.store, job_id)
        if found is None:
            return self.render(request, "missing.html", status=404, job_id=job_id)
        return self.render(
            request,
            "job.html",
            job=found,
            timeline=_timeline(found),
            bars=_bars(found.steps),
            shown=admin.SHOWN,
            latest=found.attempts[-1] if found.attempts else None,
        )

    async def unusable(self, request: Request, exc: Exception) -> Response:
        """A page that says why the database cannot serve the dashboard, and the cure:
        the schema to migrate, prepared statements to turn off."""
        if request.url.path.endswith("/metrics"):
            return PlainTextResponse(f"{exc}\n", status_code=503)
        return self.render(request, "unusable.html", status=503, problem=str(exc))

    async def metrics(self, request: Request) -> Response:
        async with pools.connection(self.app.pool) as conn:
            queues = await admin.queues(conn, self.app.store)
            try:
                workers: list[admin.WorkerState] | None = await admin.workers(conn, self.app.store)
            except errors.InsufficientPrivilege:
                workers = None  # a role that may not read asyncq_workers
        return PlainTextResponse(
            metrics.exposition(queues, workers), media_type=metrics.CONTENT_TYPE
        )

    async def style(self, request: Request) -> Response:
        return Response(_STYLE, media_type="text/css")

    async def script(self, request: Request) -> Response:
        return Response(_SCRIPT, media_type="text/javascript")

    async def icon(self, request: Request) -> Response:
        return Response(_ICON, media_type="image/svg+xml")

    # -- actions -------------------------------------------------------------------------

    def action(self, do: Callable[[Request, dict[str, str]], Awaitable[str]]) -> Handler:
        """A POST handler: refused when read-only or without a valid CSRF token; else
        ``do`` acts and names the page to go back to."""

        async def handle(request: Request) -> Response:
            form = await self.checked_form(request)
            if isinstance(form, Response):
                return form
            target = await do(request, form)
            return RedirectResponse(request.scope.get("root_path", "") + target, status_code=303)

        return handle

    async def checked_form(self, request: Request) -> dict[str, str] | Response:
        """An action's form; or its refusal: read-only, or without a valid CSRF token."""
        if self.read_only:
            return PlainTextResponse("the dashboard is read-only", status_code=403)
        form = await _form(request)
        if not self.csrf.valid(request, form.get(FIELD, "")):
            return PlainTextResponse(
                "refused: a missing or stale form token (reload the page)", status_code=403
            )
        return form

    async def requeue(self, request: Request, form: dict[str, str]) -> str:
        job_id = request.path_params["job_id"]
        async with pools.connection(self.app.pool) as conn:
            result = await admin.requeue(conn, self.app.store, [job_id])
        return f"/jobs/{job_id}?notice={'requeued' if result.requeued else 'not-requeued'}"

    async def cancel(self, request: Request, form: dict[str, str]) -> str:
        job_id = request.path_params["job_id"]
        async with pools.connection(self.app.pool) as conn:
            outcome = (await admin.cancel(conn, self.app.store, [job_id]))[job_id]
        notice = outcome if outcome in ("cancelled", "aborting") else "not-cancelled"
        return f"/jobs/{job_id}?notice={notice}"

    async def retry(self, request: Request, form: dict[str, str]) -> str:
        """Run the job again; from the step named by the form's ``step``, if given."""
        job_id = request.path_params["job_id"]
        step = form.get("step") or None
        try:
            async with pools.connection(self.app.pool) as conn:
                await admin.retry(conn, self.app.store, job_id, from_step=step)
        except (JobNotFound, ValueError):  # ended since the page was shown, pruned, no step
            return f"/jobs/{job_id}?notice=not-retried"
        return f"/jobs/{job_id}?notice={'retried' if step is None else 'retried-from-step'}"

    async def pause(self, request: Request, form: dict[str, str]) -> str:
        async with pools.connection(self.app.pool) as conn:
            changed = await admin.pause(conn, self.app.store, form.get("queue", ""))
        return f"/?notice={'paused' if changed else 'already-paused'}"

    async def resume(self, request: Request, form: dict[str, str]) -> str:
        async with pools.connection(self.app.pool) as conn:
            changed = await admin.resume(conn, self.app.store, form.get("queue", ""))
        return f"/?notice={'resumed' if changed else 'not-paused'}"


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each); Starlette's own form
    parser needs python-multipart, which these small forms do not."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadRequest("the form is too large")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise BadRequest("the form is not UTF-8") from None
    return {name: values[0] for name, values in fields.items()}


BAR = 120  # the width of the longest step's bar, in pixels


def _bars(steps: list[admin.Step]) -> list[int]:
    """Each step's bar: its length against the longest step's (at least a pixel)."""
    longest = max((s.duration_seconds or 0.0 for s in steps), default=0.0)
    return [
        max(1, round(BAR * (s.duration_seconds or 0.0) / longest)) if longest else 1 for s in steps
    ]


def _timeline(job: admin.JobDetail) -> list[tuple[str, datetime]]:
    due = {"queued": "runs at", "waiting": "due at"}
    moments = [
        ("created", job.created_at),
        ("scheduled for", job.scheduled_at),
        (due.get(job.status, "run at"), job.run_at),
        ("locked", job.locked_at),
        ("lease ends", job.expires_at),
        ("cancel asked", job.abort_requested_at),
        ("finished", job.finished_at),
    ]
    return sorted(((what, at) for what, at in moments if at is not None), key=lambda m: m[1])


async def _bad_request(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(f"bad request: {exc}", status_code=400)


def create_app(
    app: App,
    *,
    read_only: bool = False,
    authorize: Authorize | None = None,
    secret: bytes | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> Guard:
    """The dashboard of ``app`` as an ASGI app, to serve or to mount
    (``host.mount("/jobs", create_app(app, authorize=is_admin))``).

    ``app`` must be open while the dashboard serves (the host opens it in its lifespan,
    as it does to defer jobs). ``authorize(request)`` (a bool or an awaitable of one)
    decides who may see and act; a refusal is a 403 (it sees every request before the
    dashboard does: it must not read the body). ``read_only`` hides the actions
    and refuses them with 403. ``secret`` signs the CSRF tokens: give the same bytes to
    every process behind one address (default: random per process).

    ``allowed_hosts`` (``NAME`` for any port, or ``NAME:PORT``): the ``Host`` names the
    dashboard answers to; any other is a 400, and an action must come from a page of one
    of them (its ``Origin``, else its ``Referer``). Without it (mounted in a service,
    whose own host check, Starlette's ``TrustedHostMiddleware`` say, comes first), every
    ``Host`` is answered and an action must come from the request's own."""
    if isinstance(allowed_hosts, str):
        raise TypeError("allowed_hosts is a list of names, not one name")
    return build(
        app,
        read_only=read_only,
        authorize=authorize,
        secret=secret,
        hosts=None if allowed_hosts is None else AllowedHosts(allowed_hosts),
    )


def build(
    app: App,
    *,
    read_only: bool,
    authorize: Authorize | None,
    secret: bytes | None,
    hosts: AllowedHosts | None,
    login: Login | None = None,
) -> Guard:
    """`create_app`, with ``asyncq dashboard``'s own login."""
    dashboard = Dashboard(app, read_only=read_only, csrf=Csrf(secret, hosts))
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        BadRequest: _bad_request,
        listing.BadFilter: _bad_request,
        BadAction: _bad_request,
        ValueError: _bad_request,  # admin refused an argument (InvalidName is one)
        SchemaNotMigrated: dashboard.unusable,
        PreparedStatementsRefused: dashboard.unusable,
    }

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # Served on its own (`asyncq dashboard`): its bulk actions stop with it.
        yield
        await dashboard.bulk.stop()

    starlette = Starlette(routes=dashboard.routes(), exception_handlers=handlers, lifespan=lifespan)
    return Guard(starlette, authorize, hosts=hosts, login=login)


def _limited(found: admin.LimitInfo) -> bool:
    """Whether a task (or a queue) has any limit, from code or set at runtime."""
    return any(
        v is not None for v in (found.concurrency, found.rate_limit, found.group_concurrency)
    )
