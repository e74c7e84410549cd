"""Tracing (``App(tracing=True)``): a span for each defer and each attempt, recorded by the
SDK's in-memory exporter, with real workers on the test database. The attempt's span is
linked to the defer's, current while the task runs, and says how the attempt ended."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import asyncq
from asyncq import tracing
from tests.harness.tracing import memory_exporter, named

pytestmark = pytest.mark.anyio

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = memory_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
async def traced(dsn: str, spans: InMemorySpanExporter) -> AsyncIterator[asyncq.App]:
    async with asyncq.App(dsn, tracing=True) as app:
        yield app


async def drain(app: asyncq.App) -> None:
    with anyio.fail_after(30):
        await app.run_worker(drain=True, handle_signals=False, concurrency=4)


def stored_contexts(db: Any) -> dict[int, Any]:
    return dict(db.execute("SELECT id, trace_context FROM asyncq_jobs").fetchall())


def trace_id_of(context: dict[str, str]) -> int:
    return int(context["traceparent"].split("-")[1], 16)


async def test_an_attempt_links_to_its_defer_and_the_task_s_spans_are_its_children(
    traced: asyncq.App, spans: InMemorySpanExporter, db: Any
) -> None:
    tracer = trace.get_tracer("tests")

    @traced.task(queue="mail", name="t.send")
    async def send(to: str) -> None:
        with tracer.start_as_current_span("render"):
            pass

    with tracer.start_as_current_span("POST /orders") as request:
        job_id = await send.defer("a@example.com")
    await drain(traced)

    [defer] = named(spans.get_finished_spans(), "defer mail")
    [attempt] = named(spans.get_finished_spans(), "process mail")
    [render] = named(spans.get_finished_spans(), "render")
    request_context = request.get_span_context()

    # The defer: a producer span in the request's trace, whose context the row carries.
    assert defer.kind is SpanKind.PRODUCER
    assert defer.parent is not None and defer.parent.span_id == request_context.span_id
    assert defer.context.trace_id == request_context.trace_id
    assert dict(defer.attributes or {}) == {
        "messaging.system": "asyncq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "defer",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job_id),
        "asyncq.task": "t.send",
    }
    stored = stored_contexts(db)[job_id]
    assert trace_id_of(stored) == request_context.trace_id
    assert stored["traceparent"].split("-")[2] == f"{defer.context.span_id:016x}"

    # The attempt: a consumer span of a trace of its own, linked to the defer's span.
    assert attempt.kind is SpanKind.CONSUMER
    assert attempt.parent is None and attempt.context.trace_id != request_context.trace_id
    [link] = attempt.links
    assert (link.context.trace_id, link.context.span_id) == (
        defer.context.trace_id,
        defer.context.span_id,
    )
    assert dict(attempt.attributes or {}) == {
        "messaging.system": "asyncq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job_id),
        "asyncq.task": "t.send",
        "asyncq.attempt": 1,
        "asyncq.max_attempts": 3,
        "asyncq.outcome": "done",
    }
    assert attempt.status.status_code is StatusCode.UNSET

    # A span the task makes is the attempt's child.
    assert render.parent is not None and render.parent.span_id == attempt.context.span_id
    assert render.context.trace_id == attempt.context.trace_id


async def test_a_failing_attempt_is_an_error_with_its_exception(
    traced: asyncq.App, spans: InMemorySpanExporter
) -> None:
    # A limited task: the worker claims with the claim of limited tasks.
    @traced.task(name="t.flaky", max_attempts=2, retry=AT_ONCE, concurrency=5)
    async def flaky() -> None:
        raise ValueError(f"attempt {asyncq.current_job().attempt} fails")

    with trace.get_tracer("tests").start_as_current_span("request"):
        await flaky.defer()
    for _ in range(2):  # the retry comes at once
        await drain(traced)

    [defer] = named(spans.get_finished_spans(), "defer default")
    attempts = named(spans.get_finished_spans(), "process default")
    assert [a.attributes["asyncq.attempt"] for a in attempts if a.attributes] == [1, 2]
    for attempt, outcome in zip(attempts, ["retry", "failed"], strict=True):
        assert attempt.attributes is not None
        assert attempt.attributes["asyncq.outcome"] == outcome
        assert attempt.attributes["error.type"] == "ValueError"
        assert attempt.status.status_code is StatusCode.ERROR
        number = attempt.attributes["asyncq.attempt"]
        assert attempt.status.description == f"ValueError: attempt {number} fails"
        [event] = attempt.events
        assert event.name == "exception" and event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == f"attempt {number} fails"
        # Every attempt of the job links to the one defer.
        assert [link.context.span_id for link in attempt.links] == [defer.context.span_id]


async def test_each_ending_names_its_outcome(
    traced: asyncq.App, spans: InMemorySpanExporter
) -> None:
    snoozed: list[int] = []

    @traced.task(name="t.snoozes")
    async def snoozes() -> None:
        if not snoozed:
            snoozed.append(asyncq.current_job().id)
            raise asyncq.Snooze(0)

    @traced.task(name="t.retries", retry=AT_ONCE)
    async def retries() -> None:
        if asyncq.current_job().attempt == 1:
            raise asyncq.Retry(after=0)

    @traced.task(name="t.discards")
    async def discards() -> None:
        raise asyncq.Discard("not ours")

    @traced.task(name="t.slow", timeout=0.05, max_attempts=1)
    async def slow() -> None:
        await asyncio.sleep(10)

    @traced.task(name="t.cancelled")
    async def cancelled() -> None:
        await traced.cancel(asyncq.current_job().id)
        await asyncio.sleep(10)

    ids = {await task.defer(): task.name for task in (snoozes, retries, discards, slow, cancelled)}
    for _ in range(3):
        await drain(traced)

    endings: dict[str, list[tuple[Any, ...]]] = {}
    for span in named(spans.get_finished_spans(), "process default"):
        attributes = dict(span.attributes or {})
        task = ids[int(str(attributes["messaging.message.id"]))]
        endings.setdefault(task, []).append(
            (attributes["asyncq.outcome"], attributes.get("error.type"), span.status.status_code)
        )
    error, unset = StatusCode.ERROR, StatusCode.UNSET
    assert endings == {
        "t.snoozes": [("snoozed", None, unset), ("done", None, unset)],
        "t.retries": [("retry", "asyncq.control.Retry", error), ("done", None, unset)],
        "t.discards": [("discarded", "asyncq.control.Discard", error)],
        "t.slow": [("failed", "timeout", error)],
        "t.cancelled": [("cancelled", None, unset)],
    }
    [slow_span] = [
        s
        for s in named(spans.get_finished_spans(), "process default")
        if (s.attributes or {}).get("asyncq.task") == "t.slow"
    ]
    assert slow_span.status.description == (
        "TimeoutError: attempt 1 of 1 timed out after 0.05s and was cancelled"
    )
    assert not slow_span.events  # the worker's own cancellation is not the task's exception


async def test_every_form_of_defer_carries_its_span_s_context(
    traced: asyncq.App, spans: InMemorySpanExporter, db: Any
) -> None:
    @traced.task(name="t.any", group_concurrency=2)
    async def any_task(n: int = 0) -> None:
        pass

    tracer = trace.get_tracer("tests")
    forms: dict[str, list[int]] = {}
    with tracer.start_as_current_span("request") as request:
        forms["defer"] = [await any_task.defer(1)]
        forms["delay"] = [await any_task.options(delay=60).defer(2)]
        forms["unique"] = [await any_task.options(unique_key="k").defer(3)]
        forms["group"] = [await any_task.options(group="g").defer(4)]
        forms["many"] = await any_task.defer_many([{"n": 5}, {"n": 6}])
        forms["many in a group"] = await any_task.options(group="g").defer_many([{"n": 7}])
        async with traced.pool.connection() as conn, conn.transaction():
            forms["own connection"] = [await any_task.options(conn=conn).defer(8)]
        forms["defer_sync"] = [any_task.defer_sync(9)]
        forms["defer_sync, unique"] = [any_task.options(unique_key="s").defer_sync(10)]
        traced.close_sync()
        # Concurrent defers are gathered into one statement, each row with its context.
        forms["gathered"] = list(await _gather([any_task.defer(n) for n in range(20)]))

    stored = stored_contexts(db)
    ids = [job_id for form in forms.values() for job_id in form]
    assert sorted(stored) == sorted(ids)
    defers = named(spans.get_finished_spans(), "defer default")
    assert len(defers) == len(ids) - 2 + 1  # defer_many: one span for its two jobs
    span_ids = {f"{d.context.span_id:016x}" for d in defers}
    for form, form_ids in forms.items():
        for job_id in form_ids:
            context = stored[job_id]
            assert context is not None, form
            assert trace_id_of(context) == request.get_span_context().trace_id, form
            assert context["traceparent"].split("-")[2] in span_ids, form
    assert len({stored[i]["traceparent"] for i in forms["gathered"]}) == 20
    gathered = db.execute(
        "SELECT count(DISTINCT xmin::text) FROM asyncq_jobs WHERE id = ANY(%s)",
        (forms["gathered"],),
    ).fetchone()
    assert gathered is not None and gathered[0] < 20, "the defers were not gathered"
    many = [d for d in defers if (d.attributes or {}).get("messaging.batch.message_count")]
    assert sorted(d.attributes["messaging.batch.message_count"] for d in many if d.attributes) == [
        1,
        2,
    ]


async def _gather(calls: list[Any]) -> list[int]:
    return list(await asyncio.gather(*calls))


async def test_without_tracing_nothing_is_traced_and_the_column_stays_null(
    app: asyncq.App, spans: InMemorySpanExporter, db: Any
) -> None:
    @app.task(name="t.plain", group_concurrency=2)
    async def plain(n: int = 0) -> None:
        with trace.get_tracer("tests").start_as_current_span("inside"):
            pass

    with trace.get_tracer("tests").start_as_current_span("request"):
        await plain.defer(1)
        await plain.options(unique_key="k", delay=0.001).defer(2)
        await plain.options(group="g").defer(3)
        await plain.defer_many([{"n": 4}, {"n": 5}])
        async with app.pool.connection() as conn:
            await plain.options(conn=conn).defer(6)
        await _gather([plain.defer(n) for n in range(10)])
    with anyio.fail_after(30):
        await app.run_worker(drain=True, handle_signals=False)

    contexts = stored_contexts(db)
    assert len(contexts) == 16 and set(contexts.values()) == {None}
    names = {s.name for s in spans.get_finished_spans()}
    assert names == {"request", "inside"}  # the test's own spans, and no span of asyncq
    inside = named(spans.get_finished_spans(), "inside")
    assert len(inside) == 16 and all(s.parent is None for s in inside)  # no attempt span


def test_tracing_is_opt_in_and_needs_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(asyncq.ConfigurationError, match="tracing must be True or False"):
        asyncq.App(tracing="yes")  # type: ignore[arg-type]
    monkeypatch.setattr(tracing, "trace", None)
    with pytest.raises(asyncq.ConfigurationError, match=r"pip install 'asyncq\[otel\]'"):
        asyncq.App(tracing=True)


def test_asyncq_imports_and_runs_without_opentelemetry() -> None:
    # opentelemetry made unimportable: asyncq imports, and an App without tracing is made
    # without importing it; one with tracing says what to install.
    code = """
import sys
sys.modules["opentelemetry"] = None
import asyncq
asyncq.App()
assert not [m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m]]
try:
    asyncq.App(tracing=True)
except asyncq.ConfigurationError as exc:
    print(exc)
"""
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "tracing needs opentelemetry-api: pip install 'asyncq[otel]'"
