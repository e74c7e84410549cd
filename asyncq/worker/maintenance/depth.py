"""The depth sampler: counts the jobs of each queue by state for the metrics, one worker
at a time (not every worker scanning the table), each state through its own index."""

from __future__ import annotations

from asyncq.store import Conn, Store
from asyncq.worker.observer import Observer, QueueDepth


class DepthSampler:
    name = "depth"

    def __init__(self, *, store: Store, interval: float, observer: Observer) -> None:
        self.store = store
        self.interval = interval
        self.observer = observer

    async def run(self, conn: Conn) -> bool:
        rows = await self.store.queue_overview(conn)
        self.observer.queue_depth(
            [QueueDepth(r[0], r[1], r[2], r[4], r[6], waiting=r[5]) for r in rows]
        )
        return False
