"""asyncq.contrib.sqlalchemy without a database: SQLAlchemy is imported only when one of
its objects is passed, and engines on other databases are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asyncq import connections


def test_asyncq_imports_without_sqlalchemy() -> None:
    code = (
        "import sys, asyncq, asyncq.connections, asyncq.task, asyncq.cli\n"
        "found = [m for m in sys.modules if m.split('.')[0] == 'sqlalchemy']\n"
        "assert not found, found\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_session_on_another_database_is_refused() -> None:
    pytest.importorskip("sqlalchemy", reason="SQLAlchemy comes with the test extra")
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine("sqlite://")
    with Session(engine) as session:
        with pytest.raises(TypeError, match=r"sqlite\+pysqlite dialect.*postgresql\+psycopg://"):
            connections.sync_connection(session)
        assert not session.in_transaction()
    engine.dispose()


def test_other_objects_are_refused_as_before() -> None:
    with pytest.raises(TypeError, match=r"psycopg Connection .*not builtins.str"):
        connections.sync_connection("postgresql://")
