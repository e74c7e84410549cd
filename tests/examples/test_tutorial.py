"""The tutorial, copied into a new project as a reader would copy it: its files are the
code blocks with a title, and its commands run in processes of their own on a database
of their own: migrate, defer in a transaction, a worker, and the project's own tests
through the pytest plugin."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
BIN = Path(sys.executable).parent
FILE_BLOCK = re.compile(r'^```python title="([^"]+)"\n(.*?)^```', re.M | re.S)


@pytest.fixture
def database(server_dsn: str) -> Iterator[str]:
    name = f"asyncq_tutorial_{secrets.token_hex(4)}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_the_tutorial_runs_as_written(tmp_path: Path, database: str) -> None:
    files = dict(FILE_BLOCK.findall(TUTORIAL.read_text("utf-8")))
    assert set(files) == {"shop/jobs.py", "shop/orders.py", "tests/test_orders.py"}
    for name, code in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)
    (tmp_path / "shop" / "__init__.py").write_text("")
    assert conninfo_to_dict(database)["dbname"].startswith("asyncq_tutorial_")
    env = {
        **os.environ,
        "ASYNCQ_DSN": database,
        "ASYNCQ_TEST_DSN": database,
        "PYTHONPATH": str(tmp_path),
    }

    def run(*command: str) -> str:
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        return output

    run(str(BIN / "asyncq"), "migrate", "shop.jobs:app")
    ordered = run(sys.executable, "-m", "shop.orders")
    assert re.findall(r"^order (\d+)$", ordered, re.M) == ["1", "2", "3"]
    worked = run(str(BIN / "asyncq"), "worker", "shop.jobs:app", "--queue", "emails", "--drain")
    emailed = re.findall(r"emailing the confirmation of order (\d), attempt 1", worked)
    assert sorted(emailed) == ["1", "2", "3"], worked
    tested = run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests")
    assert "1 passed" in tested, tested
