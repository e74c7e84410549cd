"""Prometheus metrics of a worker (``asyncq worker --metrics-port``, extra
``asyncq[metrics]``): a listener of the worker's events, with a registry of its own,
served over HTTP at ``/metrics``. The worker's runtime knows nothing of it."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from asyncq.errors import ConfigurationError
from asyncq.job import Job
from asyncq.limits import Sourced
from asyncq.worker.observer import Observer, QueueDepth
from asyncq.worker.outcomes import Kind, Outcome

try:
    import prometheus_client as prom
    from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
except ImportError:  # pragma: no cover - depends on the extra
    prom = None  # type: ignore[assignment]

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
# The buckets' upper bounds as the exposition writes them (as prometheus_client does).
_BOUNDS = (*(repr(float(bound)) for bound in DURATION_BUCKETS), "+Inf")
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

# What a written outcome did to its job, as the label ``outcome``.
_OUTCOMES = {
    Kind.DONE: "done",
    Kind.RETRY: "retried",
    Kind.FAIL: "failed",
    Kind.SNOOZE: "snoozed",
    Kind.RELEASE: "handed_back",
    Kind.CANCEL: "cancelled",
    Kind.SUSPEND: "suspended",
    Kind.GIVE_BACK: "given_back",
}


class WorkerMetrics(Observer):
    def __init__(self) -> None:
        if prom is None:
            raise ConfigurationError(
                "metrics need prometheus-client: pip install 'asyncq[metrics]'"
            )
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.attempts = _Attempts()
        r.register(self.attempts)
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
        self.workers_seen = prom.Gauge(
            "asyncq_workers",
            "Workers listed in the database, live or dead (not refreshed for three beats),"
            " as this worker last saw them (every worker reports: take the max over them).",
            ["state"],
            registry=r,
        )
        self.limits = prom.Gauge(
            "asyncq_task_limit",
            "The limits in force of each limited task (concurrency, group_concurrency, and"
            " rate_limit in starts per second), by source: code, or an override of the task"
            " or of its queue (asyncq limits).",
            ["task", "limit", "source"],
            registry=r,
        )
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
        self.attempts.ended(outcome.job.task_name, label, outcome.duration)

    def lease_lost(self, job: Job, why: str) -> None:
        self.lost.inc()

    def fenced(self, job: Job, unrenewed: float) -> None:
        self.lost.inc()
        self.fenced_attempts.inc()

    def rescued(self, jobs: Mapping[int, str]) -> None:
        for status in jobs.values():
            self.reaped.labels(status).inc()

    def workers(self, live: int, dead: int) -> None:
        self.workers_seen.labels("live").set(live)
        self.workers_seen.labels("dead").set(dead)

    def limits_changed(self, in_force: Mapping[str, Sourced], *, at_start: bool = False) -> None:
        self.limits.clear()
        for task, s in in_force.items():
            lim = s.limits
            for name, value, source in (
                ("concurrency", lim.concurrency, s.concurrency),
                (
                    "rate_limit",
                    None if lim.rate is None else lim.rate.count / lim.rate.period,
                    s.rate,
                ),
                ("group_concurrency", lim.group_concurrency, s.group_concurrency),
            ):
                if value is not None and source is not None:
                    self.limits.labels(task, name, source).set(value)

    def queue_depth(self, queues: Sequence[QueueDepth]) -> None:
        self.depth.clear()
        for q in queues:
            for state in ("ready", "scheduled", "running", "waiting", "failed"):
                self.depth.labels(q.queue, state).set(getattr(q, state))


class _Attempts:
    """The per-attempt metrics (attempts ended by task and outcome, their durations by
    task), counted in plain numbers and read into metric families when scraped.
    prometheus_client's own counter and histogram take a lock per update, and the
    histogram searches its buckets in Python: about 18,000 instructions a job, against
    a no-op job's 84,000 in all; this is under half of that. The scrape runs in the HTTP
    server's thread and reads copies, so a job counted meanwhile may show in a count and
    not yet in its sum."""

    def __init__(self) -> None:
        self.by_outcome: dict[tuple[str, str], int] = {}
        # Per task: the attempts in each bucket (the last one past every bound), and
        # the sum of their durations.
        self.durations: dict[str, tuple[list[int], list[float]]] = {}

    def ended(self, task: str, outcome: str, seconds: float) -> None:
        key = (task, outcome)
        self.by_outcome[key] = self.by_outcome.get(key, 0) + 1
        found = self.durations.get(task)
        if found is None:
            found = self.durations[task] = ([0] * (len(DURATION_BUCKETS) + 1), [0.0])
        found[0][bisect_left(DURATION_BUCKETS, seconds)] += 1
        found[1][0] += seconds

    def collect(self) -> Iterator[Any]:
        ended = CounterMetricFamily(
            "asyncq_jobs_finished",
            "Attempts ended, by task and outcome.",
            labels=["task", "outcome"],
        )
        for (task, outcome), count in dict(self.by_outcome).items():
            ended.add_metric([task, outcome], count)
        yield ended
        duration = HistogramMetricFamily(
            "asyncq_attempt_duration_seconds",
            "How long attempts ran, by task.",
            labels=["task"],
        )
        for task, (counts, total) in dict(self.durations).items():
            cumulative = 0
            buckets = []
            for bound, count in zip(_BOUNDS, list(counts), strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            duration.add_metric([task], buckets, total[0])
        yield duration
