"""``python manage.py asyncq_migrate``: create or upgrade asyncq's tables."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from asyncq.app import App
from asyncq.contrib.django.management.commands import _common
from asyncq.errors import AsyncqError


class Command(BaseCommand):
    help = (
        "Create or upgrade asyncq's tables where an asyncq backend of TASKS writes its jobs."
        " `manage.py migrate` does it too; safe to run from several processes at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        _common.add_backend_argument(parser)

    def handle(self, *args: Any, backend: str, verbosity: int, **options: Any) -> None:
        app = _common.asyncq_backend(backend).make_app()
        try:
            applied = _common.run(_migrate, app)
        except AsyncqError as exc:
            raise CommandError(str(exc)) from None
        if verbosity:
            if applied:
                self.stdout.write(f"asyncq's tables migrated to version {applied[-1]}")
            else:
                self.stdout.write("asyncq's tables are up to date")


async def _migrate(app: App) -> list[int]:
    async with app:
        return await app.migrate()
