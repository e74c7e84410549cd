"""What operators look at, across processes: ``asyncq workers`` lists the worker processes
on the database (and a killed one until its row is old), ``asyncq job`` a job's attempts
(each with its worker, wait, run time, outcome and error), the progress its task reported
while it ran and what it logged."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from tests.harness.app import APP, REPORTING
from tests.harness.jobs import insert_jobs, job_row
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until


def listed(workers: Workers) -> list[dict[str, Any]]:
    run = workers.cli("workers", APP, "--json")
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_asyncq_workers_lists_the_live_workers_and_the_dead(db: Any, workers: Workers) -> None:
    assert workers.cli("workers", APP).stdout.strip() == "no workers"
    first = workers.start("--concurrency", "3", "--queue", "default", "--queue", "bulk")
    second = workers.start()
    found = {w["pid"]: w for w in listed(workers)}
    assert set(found) == {first.pid, second.pid}
    one = found[first.pid]
    assert one["id"] == first.worker_id and one["app"] == APP
    assert (one["queues"], one["concurrency"], one["alive"]) == (["default", "bulk"], 3, True)
    assert found[second.pid]["queues"] is None

    table = workers.cli("workers", APP).stdout.splitlines()
    assert table[0].split()[:4] == ["id", "host", "pid", "version"]
    assert sum(" live" in line for line in table[1:]) == 2

    # A worker that stops deletes its row; one killed leaves it, dead once it is not
    # refreshed for three of its beats (made old here, rather than waited for).
    second.send(signal.SIGTERM)
    assert second.wait(30) == 0
    assert [w["pid"] for w in listed(workers)] == [first.pid]
    workers.kill9(first)
    [left] = listed(workers)
    assert left["pid"] == first.pid
    db.execute(
        "UPDATE asyncq_workers SET seen_at = now() - interval '2 min' WHERE id = %s",
        (first.worker_id,),
    )
    [dead] = listed(workers)
    assert not dead["alive"] and dead["seen_seconds_ago"] >= 120
    assert "dead (no heartbeat for 2m" in workers.cli("workers", APP).stdout


def test_asyncq_job_shows_the_attempts_the_progress_and_the_logs(
    db: Any, workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    [job_id] = insert_jobs(db, REPORTING, [{"fail_first": 2, "gate": str(gate)}])
    worker = workers.start()

    # While the job runs, its progress is on its row, written by the worker.
    wait_until(lambda: job_row(db, job_id)["progress"], 15, "the first progress")
    shown = json.loads(workers.cli("job", APP, str(job_id), "--json").stdout)
    assert shown["status"] == "running"
    assert (shown["progress"]["fraction"], shown["progress"]["message"]) == (
        0.5,
        "half of attempt 1",
    )
    [running] = shown["attempts"]
    assert (running["attempt"], running["outcome"], running["worker"]) == (
        1,
        "running",
        worker.worker_id,
    )

    gate.touch()
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 15, "the job to end")
    shown = json.loads(workers.cli("job", APP, str(job_id), "--json").stdout)
    assert shown["attempts_used"] == 3
    attempts = shown["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "retried"),
        (2, "retried"),
        (3, "done"),
    ]
    for attempt in attempts:
        assert attempt["worker"] == worker.worker_id
        assert attempt["wait_seconds"] >= 0 and attempt["run_seconds"] >= 0
        [line] = attempt["logs"]["records"]
        assert (line["level"], line["logger"], line["message"]) == (
            "INFO",
            "harness.reporting",
            f"attempt {attempt['attempt']} starts",
        )
    assert attempts[0]["error"].startswith("LookupError: attempt 1 fails on purpose")
    assert "Traceback" in attempts[0]["error"]
    assert attempts[1]["progress"]["message"] == "half of attempt 2"
    assert (shown["progress"]["fraction"], shown["progress"]["message"]) == (1.0, "done")

    text = workers.cli("job", APP, str(job_id)).stdout
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("attempts  3 kept"))
    header = lines[at + 1].split()
    assert header == ["#", "outcome", "worker", "started", "waited", "ran", "error"]
    assert [line.split()[1] for line in lines[at + 2 : at + 5]] == ["retried", "retried", "done"]
    assert "LookupError: attempt 2 fails on purpose" in lines[at + 3]
    assert "progress  100% done (attempt 3" in text
    assert "INFO harness.reporting: attempt 3 starts" in text
