"""``--log-format json``: every line a JSON object with the stable ``action`` key; a
job's lines carry its id, task, attempt and duration."""

from __future__ import annotations

import json

from tests.harness.app import FAIL, SLEEP
from tests.harness.jobs import insert_jobs
from tests.harness.processes import Workers


def test_every_line_is_a_json_object_with_an_action(db, workers: Workers) -> None:
    slow = insert_jobs(db, SLEEP, [{"seconds": 0.2}])
    failing = insert_jobs(db, FAIL, [{"tag": 3}], max_attempts=1)
    run = workers.cli(
        "--log-format",
        "json",
        "--log-level",
        "DEBUG",
        "worker",
        "tests.harness.app:app",
        "--drain",
    )
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stderr.splitlines() if line.strip()]
    assert lines and all("action" in line and "message" in line for line in lines)
    by_action = {}
    for line in lines:
        by_action.setdefault(line["action"], []).append(line)
    assert {"worker_started", "job_done", "job_failed", "worker_stopped"} <= set(by_action)
    [done] = [line for line in by_action["job_done"] if line["job_id"] == slow[0]]
    assert (done["task"], done["attempt"]) == (SLEEP, 1)
    assert done["duration"] >= 0.15  # a 0.2 s sleep, on a loop whose clock ticks in ms
    [failed] = by_action["job_failed"]
    assert (failed["job_id"], failed["task"], failed["attempt"]) == (failing[0], FAIL, 1)
    assert failed["level"] == "ERROR"


def test_the_contract_form_with_the_option_after_the_command(db, workers: Workers) -> None:
    """``asyncq worker MODULE:APP --log-format json``, as the contract writes it."""
    [job] = insert_jobs(db, SLEEP, [{"seconds": 0}])
    run = workers.cli(
        "worker", "tests.harness.app:app", "--drain", "--log-format", "json", "--log-level", "DEBUG"
    )
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stderr.splitlines() if line.strip()]
    assert lines and all("action" in line for line in lines)
    assert [line["job_id"] for line in lines if line["action"] == "job_done"] == [job]
