"""``asyncq worker --metrics-port``: Prometheus metrics of a real worker process, scraped
over HTTP: jobs finished by task and outcome, attempt durations, claims, queue depth."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.harness.app import APP, FAIL, NOOP
from tests.harness.jobs import insert_jobs
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_worker_serves_its_metrics(db, workers: Workers) -> None:
    paused = workers.cli("pause", APP, "held")
    assert paused.returncode == 0, paused.stderr
    insert_jobs(db, NOOP, [{"n": n} for n in range(5)], queue="held")
    limited = workers.cli("limits", APP, FAIL, "--concurrency", "5")
    assert limited.returncode == 0, limited.stderr
    port = free_port()
    workers.start("--metrics-port", str(port))
    insert_jobs(db, NOOP, [{"n": n} for n in range(20)])
    insert_jobs(db, FAIL, [{"tag": 1}], max_attempts=1)
    insert_jobs(db, FAIL, [{"tag": 2}], max_attempts=2)  # retried once, then failed

    def finished() -> dict:
        found = scrape(port)
        done = found.get(("asyncq_jobs_finished_total", (("outcome", "done"), ("task", NOOP))))
        failed = found.get(("asyncq_jobs_finished_total", (("outcome", "failed"), ("task", FAIL))))
        return found if done == 20 and failed == 2 else {}

    found = wait_until(finished, 15, "the metrics to count every job")
    # One task's outcomes are counted apart: each (task, outcome) has its own series.
    assert found[("asyncq_jobs_finished_total", (("outcome", "retried"), ("task", FAIL)))] == 1
    assert found[("asyncq_jobs_claimed_total", ())] == 23
    assert found[("asyncq_attempt_duration_seconds_count", (("task", FAIL),))] == 3
    assert found[("asyncq_attempt_duration_seconds_count", (("task", NOOP),))] == 20
    assert found[("asyncq_claim_duration_seconds_count", ())] >= 1
    assert found[("asyncq_queue_jobs", (("queue", "held"), ("state", "ready")))] == 5
    # The limits in force, with their source: here an override set at runtime.
    limit = ("asyncq_task_limit", (("limit", "concurrency"), ("source", "task"), ("task", FAIL)))
    assert found[limit] == 5
    assert not any(
        name == "asyncq_task_limit" and dict(labels)["task"] == NOOP for name, labels in found
    )
    # The workers listed in the database, as the worker saw them at its row's refresh.
    live = ("asyncq_workers", (("state", "live"),))
    wait_until(lambda: scrape(port).get(live) == 1, 15, "the worker to count itself")
    assert scrape(port)[("asyncq_workers", (("state", "dead"),))] == 0


def test_a_bad_metrics_port_is_a_one_line_error(workers: Workers) -> None:
    run = workers.cli("worker", APP, "--metrics-port", "70000")
    assert run.returncode == 2
    assert "--metrics-port must be a whole number from 1 to 65535" in run.stderr
