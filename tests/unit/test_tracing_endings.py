"""`asyncq.tracing` without a database: the endings of an attempt no integration test
reaches (handed back at shutdown, lease lost), and the contexts a row may hold."""

from __future__ import annotations

import asyncio
import json

from opentelemetry.trace import StatusCode

from asyncq import tracing
from asyncq.job import Job
from asyncq.worker.outcomes import Kind, Outcome, Stop
from tests.harness.tracing import memory_exporter


def test_the_attempt_tracer_names_every_ending() -> None:
    # The endings tests/integration/test_tracing.py does not reach with a worker.
    exporter = memory_exporter()
    exporter.clear()
    observer = tracing.AttemptTracer(tracing.tracer())
    job = Job(9, "t.x", "q", "{}", 1, 3, 1)
    for outcome, stop in [
        (Outcome(job, Kind.RELEASE), Stop.SHUTDOWN),
        (None, Stop.LEASE_LOST),
    ]:
        ended = observer.running(job)
        ended(outcome, asyncio.CancelledError(), stop)
    handed_back, lost = exporter.get_finished_spans()
    exporter.clear()
    assert handed_back.attributes is not None and lost.attributes is not None
    assert handed_back.attributes["asyncq.outcome"] == "handed_back"
    assert handed_back.status.status_code is StatusCode.UNSET
    assert lost.attributes["asyncq.outcome"] == "lease_lost"
    assert lost.attributes["error.type"] == "lease_lost"
    assert lost.status.status_code is StatusCode.ERROR and not lost.events
    assert not handed_back.links  # no trace context in the row: no link


def test_a_row_s_context_that_is_not_one_gives_no_link() -> None:
    for text in (None, "", "not json", "[1]", '{"traceparent": 7}', '{"traceparent": "00-x"}'):
        assert tracing._links(text) == (), text
    good = json.dumps({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    [link] = tracing._links(good)
    assert link.context.span_id == 0xB7AD6B7169203331
