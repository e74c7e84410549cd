"""The sample outputs of README.md and docs/ are what the commands print now:
`tests.samples` runs them on databases of their own and compares (see its docstring).
When asyncq's output changes, `python -m tests.samples --write` (make samples) rewrites
them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import samples

ROOT = Path(__file__).resolve().parents[2]


def test_every_sample_is_marked_once_and_made_by_a_scenario() -> None:
    marked = [name for page in samples.pages() for name, _ in samples.blocks(page)]
    assert sorted(marked) == sorted(samples.SAMPLES)
    made = {
        step.sample
        for scenario in samples.SCENARIOS
        for step in scenario.steps
        if isinstance(step, samples.Run) and step.sample
    }
    assert made == set(samples.SAMPLES)


@pytest.mark.timeout(300)  # some twenty commands and examples, each a process
def test_the_samples_match_a_new_run(server_dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCQ_")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.samples", "--dsn", server_dsn],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "samples match a new run" in done.stdout, done.stdout
