"""The queue sampler: counts the jobs of each queue by state, one worker at a time (not
every worker scanning the table), each state through its own index; gives the counts to
the metrics and writes them, with the jobs ended and claimed, to the queue samples that
the dashboard's trends read once the jobs are pruned; and deletes samples past their
retention. A role without rights on the samples gives the metrics their counts alone."""

from __future__ import annotations

import logging
from datetime import timedelta

from psycopg import errors

from asyncq.store import Conn, Store
from asyncq.worker.observer import Observer, QueueDepth

logger = logging.getLogger("asyncq.worker")


class QueueSampler:
    name = "samples"

    def __init__(
        self, *, store: Store, interval: float, retention: timedelta, observer: Observer
    ) -> None:
        self.store = store
        self.interval = interval
        self.retention = retention
        self.observer = observer
        self.refused = False

    async def run(self, conn: Conn) -> bool:
        rows = await self.store.queue_overview(conn)
        self.observer.queue_depth(
            [QueueDepth(r[0], r[1], r[2], r[4], r[6], waiting=r[5]) for r in rows]
        )
        if self.refused:
            return False
        try:
            # A savepoint: refused, the gate's transaction goes on.
            async with conn.transaction():
                await self.store.write_queue_samples(
                    conn,
                    queues=[r[0] for r in rows],
                    depth=[r[1] for r in rows],
                    running=[r[4] for r in rows],
                )
                await self.store.prune_queue_samples(conn, retention=self.retention)
        except errors.InsufficientPrivilege as exc:
            self.refused = True
            logger.warning(
                "the queue trends will not outlive pruning: this worker's role may not write"
                " asyncq_queue_samples (%s); docs/least-privilege.md has the grant",
                str(exc).strip().splitlines()[0],
                extra={"action": "samples_refused"},
            )
        return False
