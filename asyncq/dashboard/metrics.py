"""The dashboard's ``/metrics``: queue depth and the workers, in the Prometheus text
format, under the names the workers' metrics use (`asyncq.metrics`), read from the
database at each scrape."""

from __future__ import annotations

from collections.abc import Sequence

from asyncq.admin import QueueOverview, WorkerState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("ready", "scheduled", "running", "waiting", "failed")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(
    queues: Sequence[QueueOverview], workers: Sequence[WorkerState] | None = None
) -> str:
    """The metrics; the workers' only when given (None: the dashboard's role may not read
    them)."""
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
    if workers is not None:
        live = sum(1 for w in workers if w.alive)
        lines += [
            "# HELP asyncq_workers Workers listed in the database, live or dead (not refreshed"
            " for three beats).",
            "# TYPE asyncq_workers gauge",
            f'asyncq_workers{{state="live"}} {live}',
            f'asyncq_workers{{state="dead"}} {len(workers) - live}',
        ]
    return "\n".join(lines) + "\n"
