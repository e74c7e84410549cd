"""``manage.py migrate`` keeps asyncq's tables up to date only if every SQL migration of
asyncq comes with a Django migration of ``asyncq.contrib.django`` (read as text: Django
is not needed here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from asyncq.migrate import LATEST_VERSION

FOLDER = Path(__file__).resolve().parents[2] / "asyncq/contrib/django/migrations"


def test_the_latest_sql_migration_has_a_django_migration() -> None:
    found = sorted(FOLDER.glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert found, FOLDER
    brought = re.search(r"^ASYNCQ_SCHEMA = (\d+)$", found[-1].read_text(), re.M)
    assert brought is not None, f"{found[-1].name} says no ASYNCQ_SCHEMA"
    assert int(brought[1]) == LATEST_VERSION, (
        f"asyncq's SQL migrations reach version {LATEST_VERSION}, but the latest Django"
        f" migration, {found[-1].name}, brings version {brought[1]}: add a Django migration"
        " that runs the same function (copy it, depend on it, and raise ASYNCQ_SCHEMA)"
    )


def test_import_asyncq_imports_no_django() -> None:
    code = (
        "import sys, asyncq, asyncq.contrib, asyncq.contrib.django, asyncq.connections;"
        " found = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'asgiref'));"
        " print(found); sys.exit(1 if found else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
