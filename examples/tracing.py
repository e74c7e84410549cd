"""Tracing with OpenTelemetry: ``App(tracing=True)`` (extra ``asyncq[otel]``).

From the repository root::

    pip install -e '.[embedded,otel]' opentelemetry-sdk
    python examples/tracing.py

Sets up the OpenTelemetry SDK to print each span as it ends (``ConsoleSpanExporter``;
in production an OTLP exporter, or ``opentelemetry-instrument``), defers a job inside a
request's span, and runs a worker in the same process until the queue is empty. The
spans printed: the request's; the defer's, its child, whose context the job row
carries; the attempt's, the first of a trace of its own, linked to the defer; and one
that the task makes, the attempt's child. The database is ``$ASYNCQ_DSN`` when it is
set, else the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import asyncq

provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")

app = asyncq.App(tracing=True)


@app.task(queue="receipts", name="tracing.send_receipt")
async def send_receipt(order_id: int) -> None:
    with tracer.start_as_current_span("render receipt"):  # a child of the attempt's span
        await asyncio.sleep(0.01)


async def main() -> int:
    async with app:
        await app.migrate()
        with tracer.start_as_current_span("POST /orders"):
            await send_receipt.defer(42)
        await app.run_worker(queues=["receipts"], drain=True, handle_signals=False)
    return 0


if __name__ == "__main__":
    logging.basicConfig(
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("asyncq").setLevel(logging.WARNING)
    sys.exit(asyncio.run(main()))
