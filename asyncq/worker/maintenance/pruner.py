"""The pruner: deletes done rows older than the App's retention, in batches, with their
steps; and events emitted before it."""

from __future__ import annotations

from datetime import timedelta

from asyncq.store import Conn, Store

PRUNE_LIMIT = 10_000


class Pruner:
    name = "pruner"

    def __init__(self, *, store: Store, interval: float, retention: timedelta) -> None:
        self.store = store
        self.interval = interval
        self.retention = retention

    async def run(self, conn: Conn) -> bool:
        pruned = await self.store.prune_done(conn, retention=self.retention, limit=PRUNE_LIMIT)
        events = await self.store.prune_events(conn, retention=self.retention, limit=PRUNE_LIMIT)
        return pruned == PRUNE_LIMIT or events == PRUNE_LIMIT
