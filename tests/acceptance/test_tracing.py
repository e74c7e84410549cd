"""Tracing across processes: a defer in this process, its attempt in an ``asyncq worker``
process that exports its spans to a file; the attempt's span links to the defer's trace
through the job row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from opentelemetry import trace

import asyncq
from tests.harness.processes import Workers
from tests.harness.tracing import memory_exporter, named
from tests.harness.waiting import wait_until


def test_an_attempt_in_a_worker_process_links_to_the_defer_in_this_one(
    dsn: str, workers: Workers, tmp_path: Path
) -> None:
    spans = memory_exporter()
    spans.clear()
    trace_file = tmp_path / "worker-spans.jsonl"

    async def defer() -> int:
        async with asyncq.App(dsn, tracing=True) as app:
            greet = app.task(name="traced.greet", queue="traced")(_greet)
            with trace.get_tracer("tests").start_as_current_span("POST /greetings"):
                return await greet.defer("Ada")

    job_id = anyio.run(defer)
    [defer_span] = named(spans.get_finished_spans(), "defer traced")
    assert defer_span.context is not None
    spans.clear()

    workers.start(app="tests.harness.traced_app:app", env=workers.env(TRACE_FILE=str(trace_file)))

    def exported() -> list[dict[str, Any]]:
        if not trace_file.exists():
            return []
        found = [json.loads(line) for line in trace_file.read_text().splitlines()]
        return found if any(s["name"] == "process traced" for s in found) else []

    found = {s["name"]: s for s in wait_until(exported, 20, "the worker to export its spans")}
    attempt, inner = found["process traced"], found["compose greeting"]
    assert attempt["kind"] == "CONSUMER" and attempt["status"] == "UNSET"
    assert attempt["attributes"]["messaging.message.id"] == str(job_id)
    assert attempt["attributes"]["asyncq.outcome"] == "done"
    assert attempt["links"] == [
        {
            "trace_id": f"{defer_span.context.trace_id:032x}",
            "span_id": f"{defer_span.context.span_id:016x}",
        }
    ]
    assert attempt["trace_id"] != f"{defer_span.context.trace_id:032x}"  # a trace of its own
    assert inner["parent_id"] == attempt["span_id"] and inner["trace_id"] == attempt["trace_id"]
    workers.stop_all()
    assert not workers.tracebacks()


async def _greet(name: str) -> str:
    return f"hello {name}"
