"""``python manage.py asyncq_worker``: run a worker for the tasks of an asyncq backend."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from asyncq.app import App
from asyncq.contrib.django.management.commands import _common
from asyncq.errors import AsyncqError, ConfigurationError
from asyncq.worker import settings as worker_settings
from asyncq.worker.observer import WorkerStats


class Command(BaseCommand):
    help = (
        "Run an asyncq worker for the tasks of an asyncq backend of TASKS until SIGTERM or"
        " SIGINT (a second signal exits at once). Without --queue it serves the backend's"
        " QUEUES (as asyncq queues, after its queue_map), or every queue when QUEUES is"
        " empty. Plain functions run in its thread pool (--threads), coroutine functions on"
        " its event loop."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        _common.add_backend_argument(parser)
        worker_settings.add_arguments(parser)

    def handle(self, *args: Any, backend: str, verbosity: int, **options: Any) -> None:
        asyncq_backend = _common.asyncq_backend(backend)
        try:
            queues, worker_options = worker_settings.from_arguments(argparse.Namespace(**options))
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        served: Sequence[str] | None = queues
        if served is None:
            served = asyncq_backend.worker_queues()
        _common.configure_logging(verbosity)
        app = asyncq_backend.make_app()
        try:
            stats = _common.run(_work, app, served, worker_options)
        except AsyncqError as exc:
            raise CommandError(str(exc)) from None
        if stats.left_running:
            # Tasks that would not stop still run in this process; the event loop would
            # wait for them for ever on its way out. Their leases bring their jobs back.
            logging.shutdown()
            os._exit(0)


async def _work(app: App, queues: Sequence[str] | None, options: dict[str, Any]) -> WorkerStats:
    return await app.run_worker(queues, **options)
