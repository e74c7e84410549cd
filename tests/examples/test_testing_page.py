"""docs/how-to/testing.md, copied into a new project as a reader would copy it: its files
are the code blocks with a title, and its tests run with pytest, through the plugin, on a
database of their own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "testing.md"
FILE_BLOCK = re.compile(r'^```python title="([^"]+)"\n(.*?)^```', re.M | re.S)


def test_the_testing_page_runs_as_written(tmp_path: Path, throwaway_dsn: str) -> None:
    files = dict(FILE_BLOCK.findall(PAGE.read_text("utf-8")))
    assert {"shop/jobs.py", "tests/conftest.py", "tests/test_inline.py"} <= set(files)
    for name, code in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)
    (tmp_path / "shop" / "__init__.py").write_text("")
    tests = re.findall(r"^async def (test_\w+)", "".join(files.values()), re.M)
    env = {**os.environ, "ASYNCQ_TEST_DSN": throwaway_dsn, "PYTHONPATH": str(tmp_path)}
    env.pop("ASYNCQ_DSN", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "error", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert f"{len(tests)} passed" in output, output
