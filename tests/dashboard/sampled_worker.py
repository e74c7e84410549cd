"""A worker process whose done jobs are pruned five seconds after they end and whose
queues are sampled five times a second: ``python -m tests.dashboard.sampled_worker``
with ``$ASYNCQ_DSN``. Its task, `send`, does nothing; with ``fail=True`` it fails for
good."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import asyncq

QUEUE = "trends"
app = asyncq.App(retention=timedelta(seconds=5))


@app.task(name="trends.send", queue=QUEUE, max_attempts=1)
async def send(fail: bool = False) -> None:
    if fail:
        raise RuntimeError("refused")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(
        app.run_worker([QUEUE], prune_interval=0.2, samples_interval=0.2, handle_signals=True)
    )
