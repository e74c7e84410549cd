"""The dashboard's ``/metrics``: queue depth in the Prometheus text format, under the
name the workers' metrics use (`asyncq.metrics`), read from the database at each scrape."""

from __future__ import annotations

from collections.abc import Sequence

from asyncq.admin import QueueOverview

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("ready", "scheduled", "running", "waiting", "failed")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(queues: Sequence[QueueOverview]) -> str:
    lines = [
        "# HELP asyncq_queue_jobs Jobs by queue and state.",
        "# TYPE asyncq_queue_jobs gauge",
    ]
    for q in queues:
        for state in STATES:
            lines.append(
                f'asyncq_queue_jobs{{queue="{_label(q.name)}",state="{state}"}} {getattr(q, state)}'
            )
    lines += [
        "# HELP asyncq_queue_paused Whether the queue is paused (1) or not (0).",
        "# TYPE asyncq_queue_paused gauge",
    ]
    lines += [f'asyncq_queue_paused{{queue="{_label(q.name)}"}} {int(q.paused)}' for q in queues]
    return "\n".join(lines) + "\n"
