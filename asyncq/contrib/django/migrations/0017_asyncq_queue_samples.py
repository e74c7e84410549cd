"""asyncq's schema version 29 (each queue minute by minute, kept past pruning), made by
asyncq's own migrations, as the first migration makes the tables."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

# The asyncq schema version (sql/migrations/) that running this migration brings.
ASYNCQ_SCHEMA = 29


def migrate_asyncq(apps: Any, schema_editor: Any) -> None:
    from asyncq.contrib.django.backend import migrate_database

    migrate_database(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False  # asyncq's migrations run on connections of their own
    dependencies: ClassVar[list[tuple[str, str]]] = [("asyncq", "0016_asyncq_audit_progress")]
    operations = [migrations.RunPython(migrate_asyncq, migrations.RunPython.noop)]  # noqa: RUF012
