"""A server process whose program file was deleted (its virtualenv removed) is told apart
from one whose file is there: the embedded server's start stops the former."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncq.embedded import running_from_deleted_files


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/exe")
def test_a_process_whose_program_was_deleted_is_seen(tmp_path: Path) -> None:
    program = tmp_path / "sleeper"
    shutil.copy("/bin/sleep", program)
    process = subprocess.Popen([str(program), "30"])
    try:
        assert not running_from_deleted_files(process.pid)
        program.unlink()
        assert running_from_deleted_files(process.pid)
    finally:
        process.kill()
        process.wait()


def test_no_such_process_is_not_orphaned() -> None:
    assert not running_from_deleted_files(2**22 + 12345)
