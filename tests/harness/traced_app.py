"""A traced App for worker processes (``tests.harness.traced_app:app``): its spans go,
one JSON object a line, to the file ``$TRACE_FILE`` names. The database is $ASYNCQ_DSN."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import asyncq


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                out.write(json.dumps(describe(span)) + "\n")
        return SpanExportResult.SUCCESS


def describe(span: ReadableSpan) -> dict[str, object]:
    assert span.context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["TRACE_FILE"])))
trace.set_tracer_provider(provider)

app = asyncq.App(tracing=True)


@app.task(name="traced.greet", queue="traced")
async def greet(name: str) -> str:
    with trace.get_tracer("tests.harness").start_as_current_span("compose greeting"):
        return f"hello {name}"
