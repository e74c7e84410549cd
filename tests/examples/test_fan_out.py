"""examples/fan_out.py runs end to end against the test database: 100 children spawned
once, each retried on its own until answered, gathered by a parent that waited for them
suspended, and summarised."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fan_out.py"


async def test_a_hundred_children_are_retried_gathered_and_summarised(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(90):
        result = await anyio.run_process(
            [sys.executable, str(EXAMPLE)], env=env, check=False, stdin=None
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert "every section summarised" in output
    assert "answered:  100 of 100 sections" in output
    assert "summary:   Mostly about " in output
    assert "split() ran 1 time(s)" in output  # a finished step does not run again

    [(parent, status, attempts, claims, answered)] = db.execute(
        "SELECT id, status::text, attempts, claims, (result->>'answered')::int FROM asyncq_jobs"
        " WHERE task_name = 'fan_out.summarise_document'"
    ).fetchall()
    assert (status, answered) == ("done", 100)
    assert claims == attempts + 1  # one more run than attempts: the gather's, not counted
    steps = db.execute(
        "SELECT name, seq FROM asyncq_steps WHERE job_id = %s ORDER BY position", (parent,)
    ).fetchall()
    assert steps == [("split", 1), ("asyncq.spawn:fan_out.summarise_section", 1), ("summarise", 1)]

    [(children, done, answered_once, retried)] = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'done'),"
        " count(*) FILTER (WHERE (SELECT count(*) FROM asyncq_steps s WHERE s.job_id = j.id"
        "                         AND s.name = 'llm') = 1),"
        " count(*) FILTER (WHERE attempts > 1)"
        " FROM asyncq_jobs j WHERE parent_id = %s",
        (parent,),
    ).fetchall()
    assert (children, done, answered_once) == (100, 100, 100)
    # One call in five is rate-limited: some children ran more than once (all of them
    # answering at the first attempt has a chance of 0.8 ** 100).
    assert retried > 0
    assert db.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (101,)
