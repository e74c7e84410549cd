"""Lost wake-ups: waiting jobs whose wait is over but that still wait (the statement that
should have woken them cut short, say), woken as they would have been; and waiting jobs
come due whose wake-up notification was missed."""

from __future__ import annotations

from asyncq.store import Conn, Store

WAKE_LIMIT = 1000


class LostWakeups:
    name = "wakeups"

    def __init__(self, *, store: Store, interval: float) -> None:
        self.store = store
        self.interval = interval

    async def run(self, conn: Conn) -> bool:
        woken = await self.store.wake_lost(conn, limit=WAKE_LIMIT)
        due = await self.store.wake_due(conn, limit=WAKE_LIMIT)
        return len(woken) >= WAKE_LIMIT or due >= WAKE_LIMIT
