"""Prometheus metrics of a worker (``asyncq worker --metrics-port``, extra
``asyncq[metrics]``): a listener of the worker's events, with a registry of its own,
served over HTTP at ``/metrics``. The worker's runtime knows nothing of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asyncq.errors import ConfigurationError
from asyncq.job import Job
from asyncq.worker.observer import Observer, QueueDepth
from asyncq.worker.outcomes import Kind, Outcome

try:
    import prometheus_client as prom
except ImportError:  # pragma: no cover - depends on the extra
    prom = None  # type: ignore[assignment]

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

# What a written outcome did to its job, as the label ``outcome``.
_OUTCOMES = {
    Kind.DONE: "done",
    Kind.RETRY: "retried",
    Kind.FAIL: "failed",
    Kind.SNOOZE: "snoozed",
    Kind.RELEASE: "handed_back",
    Kind.CANCEL: "cancelled",
}


class WorkerMetrics(Observer):
    def __init__(self) -> None:
        if prom is None:
            raise ConfigurationError(
                "metrics need prometheus-client: pip install 'asyncq[metrics]'"
            )
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.ended = prom.Counter(
            "asyncq_jobs_finished",
            "Attempts ended, by task and outcome.",
            ["task", "outcome"],
            registry=r,
        )
        self.duration = prom.Histogram(
            "asyncq_attempt_duration_seconds",
            "How long attempts ran, by task.",
            ["task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.claimed_jobs = prom.Counter("asyncq_jobs_claimed", "Jobs claimed.", registry=r)
        self.claim_seconds = prom.Histogram(
            "asyncq_claim_duration_seconds",
            "How long claims that took jobs took.",
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.lost = prom.Counter(
            "asyncq_leases_lost", "Attempts whose lease this worker lost.", registry=r
        )
        self.fenced_attempts = prom.Counter(
            "asyncq_attempts_fenced",
            "Attempts this worker stopped because it could not renew their lease in time"
            " (also counted in asyncq_leases_lost).",
            registry=r,
        )
        self.reaped = prom.Counter(
            "asyncq_jobs_reaped",
            "Jobs of dead workers taken back, by the state they went to.",
            ["status"],
            registry=r,
        )
        self.depth = prom.Gauge(
            "asyncq_queue_jobs",
            "Jobs by queue and state (sampled by one worker at a time: take the max over workers).",
            ["queue", "state"],
            registry=r,
        )
        # The children of the per-job metrics, by (task, outcome): prometheus_client's
        # ``labels()`` validates and looks them up under a lock, several microseconds a
        # call, more than the rest of a no-op job's bookkeeping.
        self._per_job: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._server: Any = None

    def serve(self, port: int, host: str) -> None:
        assert prom is not None
        try:
            started = prom.start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc}") from None
        self._server = started[0] if isinstance(started, tuple) else None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- the worker's events -------------------------------------------------------

    def claimed(self, jobs: Sequence[Job], seconds: float) -> None:
        self.claimed_jobs.inc(len(jobs))
        self.claim_seconds.observe(seconds)

    def finished(self, outcome: Outcome, status: str) -> None:
        kind = outcome.kind
        label = "failed" if kind is Kind.RETRY and status == "failed" else _OUTCOMES[kind]
        if status == "cancelled":
            label = "cancelled"
        key = (outcome.job.task_name, label)
        children = self._per_job.get(key)
        if children is None:
            task = key[0]
            children = self._per_job[key] = (
                self.ended.labels(task, label),
                self.duration.labels(task),
            )
        children[0].inc()
        children[1].observe(outcome.duration)

    def lease_lost(self, job: Job, why: str) -> None:
        self.lost.inc()

    def fenced(self, job: Job, unrenewed: float) -> None:
        self.lost.inc()
        self.fenced_attempts.inc()

    def rescued(self, jobs: Mapping[int, str]) -> None:
        for status in jobs.values():
            self.reaped.labels(status).inc()

    def queue_depth(self, queues: Sequence[QueueDepth]) -> None:
        self.depth.clear()
        for q in queues:
            for state in ("ready", "scheduled", "running", "failed"):
                self.depth.labels(q.queue, state).set(getattr(q, state))
