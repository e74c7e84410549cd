"""asyncq's tables, made by asyncq's own migrations (idempotent, under a lock), in the
database being migrated, for every asyncq backend of ``TASKS`` that writes on it."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

# The asyncq schema version (sql/migrations/) that running this migration brings. Each
# later SQL migration comes with a Django migration of its own, which runs the same
# function, so that `manage.py migrate` keeps asyncq's tables up to date
# (tests/unit/test_contrib_django.py checks that one exists).
ASYNCQ_SCHEMA = 8


def migrate_asyncq(apps: Any, schema_editor: Any) -> None:
    from asyncq.contrib.django.backend import migrate_database

    migrate_database(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False  # asyncq's migrations run on connections of their own
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations = [migrations.RunPython(migrate_asyncq, migrations.RunPython.noop)]  # noqa: RUF012
