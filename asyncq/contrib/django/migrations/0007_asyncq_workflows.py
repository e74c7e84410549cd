"""asyncq's schema version 16 (work that spans jobs: steps, durable sleeps and waits,
events, children, dependencies), made by asyncq's own migrations, as the first migration
makes the tables."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

# The asyncq schema version (sql/migrations/) that running this migration brings.
ASYNCQ_SCHEMA = 16


def migrate_asyncq(apps: Any, schema_editor: Any) -> None:
    from asyncq.contrib.django.backend import migrate_database

    migrate_database(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False  # asyncq's migrations run on connections of their own
    dependencies: ClassVar[list[tuple[str, str]]] = [("asyncq", "0006_asyncq_pinned_plans")]
    operations = [migrations.RunPython(migrate_asyncq, migrations.RunPython.noop)]  # noqa: RUF012
