"""Fixtures for the acceptance tests; the helpers live in `tests.acceptance.support`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.support import Ledger, Workers


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.txt")


@pytest.fixture
def workers(dsn: str, ledger: Ledger, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(dsn, ledger, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()
