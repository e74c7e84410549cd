"""The fault suite: slow, so it runs only when asked for (``pytest -m faults``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.pgctl import ControlledPostgres

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="module")
def server() -> Iterator[ControlledPostgres]:
    """A server of the module's own, destroyed after it (test_listener.py has its own)."""
    pg = ControlledPostgres()
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.destroy()
