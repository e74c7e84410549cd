"""asyncq's schema version 28 (a bulk action's audit record written as it runs), made by
asyncq's own migrations, as the first migration makes the tables."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

# The asyncq schema version (sql/migrations/) that running this migration brings.
ASYNCQ_SCHEMA = 28


def migrate_asyncq(apps: Any, schema_editor: Any) -> None:
    from asyncq.contrib.django.backend import migrate_database

    migrate_database(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False  # asyncq's migrations run on connections of their own
    dependencies: ClassVar[list[tuple[str, str]]] = [("asyncq", "0015_asyncq_lighter_plain_path")]
    operations = [migrations.RunPython(migrate_asyncq, migrations.RunPython.noop)]  # noqa: RUF012
