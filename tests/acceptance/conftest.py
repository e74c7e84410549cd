"""Fixtures for the acceptance tests: worker processes of the harness app on the test
database (`tests.harness`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.ledger import Ledger
from tests.harness.processes import Workers


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()
