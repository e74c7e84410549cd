"""examples/tracing.py runs end to end against the test database, and prints the spans it
promises: the attempt's span links to the defer's, and the task's span is its child."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tracing.py"


def printed_spans(text: str) -> dict[str, dict[str, Any]]:
    """The JSON objects ConsoleSpanExporter printed, one after the other, by name."""
    decoder, spans, at = json.JSONDecoder(), {}, 0
    while (at := text.find("{", at)) != -1:
        span, at = decoder.raw_decode(text, at)
        spans[span["name"]] = span
    return spans


async def test_the_attempt_links_to_the_defer_and_the_task_s_span_is_its_child(dsn: str) -> None:
    env = {**os.environ, "ASYNCQ_DSN": dsn}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(EXAMPLE)], env=env, check=False, stdin=None
        )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert not result.stderr, result.stderr.decode()
    spans = printed_spans(result.stdout.decode())
    assert set(spans) == {"POST /orders", "defer receipts", "process receipts", "render receipt"}
    request, defer = spans["POST /orders"], spans["defer receipts"]
    attempt, render = spans["process receipts"], spans["render receipt"]
    assert defer["parent_id"] == request["context"]["span_id"]
    assert defer["kind"] == "SpanKind.PRODUCER" and attempt["kind"] == "SpanKind.CONSUMER"
    assert attempt["parent_id"] is None
    assert [link["context"]["span_id"] for link in attempt["links"]] == [
        defer["context"]["span_id"]
    ]
    assert attempt["links"][0]["context"]["trace_id"] == request["context"]["trace_id"]
    assert render["parent_id"] == attempt["context"]["span_id"]
    assert attempt["attributes"]["asyncq.outcome"] == "done"
