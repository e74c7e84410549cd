"""OpenTelemetry tracing (``App(tracing=True)``, extra ``asyncq[otel]``).

A span for each defer and for each attempt, named and described by the messaging
semantic conventions (``messaging.system`` is ``asyncq``, the destination is the queue,
the message id the job id):

- a defer is a PRODUCER span, ``defer <queue>`` (operation type ``send``), current while
  the job is written: the job row carries its context in ``trace_context``, as the
  configured propagator writes it (by default the W3C ``traceparent`` and ``tracestate``);
- an attempt is a CONSUMER span, ``process <queue>`` (operation type ``process``),
  current while the task runs, so the spans the task makes are its children. It starts
  a trace of its own, linked to the defer's span: the request that deferred a job ends
  long before the job's last attempt (a retry may come hours later, and a job may be
  run many times or a defer make thousands of jobs), and a link keeps each trace the
  size of one piece of work while a tracing backend still leads from one to the other.

The spans go to the global tracer provider (``opentelemetry.trace``): configure the SDK
and an exporter as for any other instrumentation. Nothing here is imported, and nothing
is written to ``trace_context``, unless an App has ``tracing=True``; the worker's runtime
knows nothing of it either: `AttemptTracer` is a listener of the worker's events, around
each attempt through `Observer.running`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from psycopg import AsyncConnection, Connection

from asyncq.control import Discard
from asyncq.errors import ConfigurationError
from asyncq.job import Job
from asyncq.store import NewJob, Store
from asyncq.worker.observer import AttemptEnded, Observer
from asyncq.worker.outcomes import Kind, Outcome, Stop
from asyncq.writer import Writer

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
except ImportError:  # pragma: no cover - depends on the extra
    trace = None  # type: ignore[assignment]

SYSTEM = "asyncq"

# What became of the job, as the attempt span's attribute ``asyncq.outcome``.
_OUTCOMES = {
    Kind.DONE: "done",
    Kind.RETRY: "retry",
    Kind.FAIL: "failed",
    Kind.SNOOZE: "snoozed",
    Kind.RELEASE: "handed_back",
    Kind.CANCEL: "cancelled",
}
# The outcomes that make an attempt span's status ERROR.
_ERRORS = {"retry", "failed", "discarded", "lease_lost"}


def tracer() -> Tracer:
    """asyncq's tracer, from the global tracer provider (a proxy until one is set)."""
    if trace is None:
        raise ConfigurationError("tracing needs opentelemetry-api: pip install 'asyncq[otel]'")
    from asyncq import __version__

    return trace.get_tracer("asyncq", __version__)


class TracedWriter(Writer):
    """The App's writer with tracing on: every kind of defer (gathered, alone, on the
    caller's connection, with a unique key or a group, `defer_many`) in a span whose
    context the job rows carry. Its store is a traced one (``Store(traced=True)``)."""

    def __init__(self, store: Store, *, max_args_bytes: int, tracer: Tracer) -> None:
        super().__init__(store, max_args_bytes=max_args_bytes)
        self.tracer = tracer

    async def write(self, job: NewJob) -> int:
        with self._deferring(job) as (span, traced):
            job_id = await super().write(traced)
            span.set_attribute("messaging.message.id", str(job_id))
            return job_id

    async def write_alone(
        self, job: NewJob, *, conn: AsyncConnection[Any] | None, unique_key: str | None
    ) -> int:
        with self._deferring(job) as (span, traced):
            job_id = await super().write_alone(traced, conn=conn, unique_key=unique_key)
            span.set_attribute("messaging.message.id", str(job_id))
            return job_id

    def write_sync(
        self, job: NewJob, *, conn: Connection[Any] | None, unique_key: str | None
    ) -> int:
        with self._deferring(job) as (span, traced):
            job_id = super().write_sync(traced, conn=conn, unique_key=unique_key)
            span.set_attribute("messaging.message.id", str(job_id))
            return job_id

    async def write_many(self, jobs: NewJob, *, conn: AsyncConnection[Any] | None) -> list[int]:
        with self._deferring(jobs) as (span, traced):
            ids = await super().write_many(traced, conn=conn)
            span.set_attribute("messaging.batch.message_count", len(ids))
            return ids

    @contextmanager
    def _deferring(self, job: NewJob) -> Iterator[tuple[Span, NewJob]]:
        """The defer's span, current; and the job with that span's context."""
        with self.tracer.start_as_current_span(
            f"defer {job.queue}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "defer",
                "messaging.destination.name": job.queue,
                "asyncq.task": job.task_name,
            },
        ) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            # No carrier (no tracer provider and no trace to join): the row gets none.
            yield span, job._replace(trace_context=json.dumps(carrier)) if carrier else job


class AttemptTracer(Observer):
    """A span around each attempt: current while the task runs, linked to the span of
    the defer that wrote the job, ended with what became of the job."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def running(self, job: Job) -> AttemptEnded:
        span = self.tracer.start_span(
            f"process {job.queue}",
            context=otel_context.Context(),  # a trace of its own: the defer is linked
            kind=SpanKind.CONSUMER,
            links=_links(job.trace_context),
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "asyncq.task": job.task_name,
                "asyncq.attempt": job.attempt,
                "asyncq.max_attempts": job.max_attempts,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))

        def ended(outcome: Outcome | None, error: BaseException | None, stop: Stop | None) -> None:
            try:
                _end(span, outcome, error, stop)
            finally:
                otel_context.detach(token)
                span.end()

        return ended


def _links(trace_context: str | None) -> Sequence[Link]:
    """A link to the defer's span, from the context its row carries (none when it
    carries none, or one that is not a context: rows may be written with plain SQL)."""
    if not trace_context:
        return ()
    try:
        carrier = json.loads(trace_context)
    except ValueError:
        return ()
    if not isinstance(carrier, dict):
        return ()
    text = {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
    linked = trace.get_current_span(propagate.extract(text)).get_span_context()
    return (Link(linked),) if linked.is_valid else ()


def _end(
    span: Span, outcome: Outcome | None, error: BaseException | None, stop: Stop | None
) -> None:
    if outcome is None:
        name = "lease_lost"
    elif outcome.kind is Kind.FAIL and isinstance(error, Discard):
        name = "discarded"
    else:
        name = _OUTCOMES[outcome.kind]
    span.set_attribute("asyncq.outcome", name)
    if name not in _ERRORS:
        return
    if stop is None and error is not None:  # the task's own exception (Retry, Discard too)
        span.record_exception(error)
    if stop is Stop.TIMEOUT:
        error_type = "timeout"
    elif outcome is None:
        error_type = "lease_lost"
    else:
        error_type = _qualified_name(type(error)) if error is not None else "error"
    span.set_attribute("error.type", error_type)
    description = outcome.error if outcome is not None and outcome.error else "lease lost"
    span.set_status(Status(StatusCode.ERROR, description.splitlines()[0]))


def _qualified_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
