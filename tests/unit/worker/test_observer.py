"""The worker's events: the counts a worker returns, and the log lines, come from them."""

from __future__ import annotations

import logging

import pytest

from asyncq.job import Job
from asyncq.worker.observer import AttemptEnded, Counts, LogObserver, Observer, Observers
from asyncq.worker.outcomes import Kind, Outcome

JOB = Job(3, "t.send", "q", '{"secret": "hunter2"}', 2, 3, 4)


def test_counts_make_the_worker_stats() -> None:
    counts = Counts()
    both = Observers([Observer(), counts])
    both.claimed([JOB, JOB], 0.001)
    for kind, status in [
        (Kind.DONE, "done"),
        (Kind.RETRY, "queued"),
        (Kind.FAIL, "failed"),
        (Kind.SNOOZE, "queued"),
        (Kind.RELEASE, "queued"),
    ]:
        both.finished(Outcome(JOB, kind), status)
    both.lease_lost(JOB, "reaped")
    both.fenced(JOB, 4.8)
    stats = counts.stats("w", left_running=1)
    assert (stats.claimed, stats.done, stats.failed_attempts, stats.released) == (2, 1, 2, 1)
    assert (stats.snoozed, stats.lost, stats.left_running, stats.fenced) == (1, 2, 1, 1)


def test_log_lines_carry_an_action_and_never_the_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = LogObserver()
    with caplog.at_level(logging.DEBUG, logger="asyncq.worker"):
        log.finished(Outcome(JOB, Kind.DONE), "done")
        log.finished(Outcome(JOB, Kind.RETRY, error="ValueError: no\nTraceback", delay=2), "queued")
        log.finished(Outcome(JOB, Kind.FAIL, error="Discard: gone"), "failed")
        log.lease_lost(JOB, "reaped or claimed elsewhere")
        log.fenced(JOB, 4.83)
        log.service_failed("listener", TimeoutError(), 1.5)
    actions = [getattr(r, "action", None) for r in caplog.records]
    # A job done is logged at DEBUG only (at INFO a busy worker would log every job).
    assert actions == [
        "job_done",
        "job_retry",
        "job_failed",
        "lease_lost",
        "lease_fenced",
        "listener_failed",
    ]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "hunter2" not in text and "Traceback" not in text
    assert "job 3 (t.send) attempt 2 of 3 failed, retrying in 2.0s: ValueError: no" in text
    assert "listener connection lost (TimeoutError); trying again in 1.5s" in text
    assert (
        "job 3 (t.send): lease not renewed for 4.8s: stopping attempt 2 before another worker"
        " may take the job" in text
    )


def test_a_result_not_stored_is_a_warning_that_names_the_task_and_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    why = "the result of t.send must be JSON-serialisable: Object of type set is not JSON ..."
    with caplog.at_level(logging.DEBUG, logger="asyncq.worker"):
        LogObserver().finished(Outcome(JOB, Kind.DONE, unstored=why), "done")
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert getattr(record, "action", None) == "result_not_stored"
    assert record.getMessage() == f"job 3 (t.send) is done, but its result is not stored: {why}"


def test_observers_watch_attempts_only_through_those_that_do() -> None:
    calls: list[str] = []

    class Around(Observer):
        def __init__(self, name: str) -> None:
            self.name = name

        def running(self, job: Job) -> AttemptEnded | None:
            calls.append(f"{self.name} starts")
            return lambda outcome, error, stop: calls.append(f"{self.name} ends")

    assert not Observers([LogObserver(), Counts(), Observer()]).watches_attempts
    assert Observers([LogObserver(), Counts()]).running(JOB) is None
    one = Observers([LogObserver(), Around("a")])
    assert one.watches_attempts
    ended = one.running(JOB)
    assert ended is not None
    ended(None, None, None)
    assert calls == ["a starts", "a ends"]
    calls.clear()
    ended = Observers([Around("a"), Counts(), Around("b")]).running(JOB)
    assert ended is not None
    ended(Outcome(JOB, Kind.DONE), None, None)
    assert calls == ["a starts", "b starts", "b ends", "a ends"]


def test_the_metrics_count_an_attempt_stopped_by_the_self_fence_as_a_lease_lost_too() -> None:
    pytest.importorskip("prometheus_client")
    from asyncq.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    metrics.fenced(JOB, 4.8)
    metrics.lease_lost(JOB, "reaped")
    value = metrics.registry.get_sample_value
    assert value("asyncq_attempts_fenced_total") == 1
    assert value("asyncq_leases_lost_total") == 2


def test_the_metrics_count_attempts_by_task_and_outcome_and_bucket_their_durations() -> None:
    pytest.importorskip("prometheus_client")
    from asyncq.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    for seconds in (0.005, 0.0051, 2.0, 1000.0):  # a bucket holds durations up to its bound
        metrics.finished(Outcome(JOB, Kind.DONE, duration=seconds), "done")
    metrics.finished(Outcome(JOB, Kind.RETRY, duration=0.1), "queued")
    value = metrics.registry.get_sample_value
    task = {"task": JOB.task_name}
    assert value("asyncq_jobs_finished_total", task | {"outcome": "done"}) == 4
    assert value("asyncq_jobs_finished_total", task | {"outcome": "retried"}) == 1
    buckets = {"0.005": 1, "0.01": 2, "0.1": 3, "1.0": 3, "2.5": 4, "900.0": 4, "+Inf": 5}
    for bound, count in buckets.items():
        assert value("asyncq_attempt_duration_seconds_bucket", task | {"le": bound}) == count
    assert value("asyncq_attempt_duration_seconds_count", task) == 5
    assert value("asyncq_attempt_duration_seconds_sum", task) == pytest.approx(1002.1101)
