"""The rescuer: jobs whose lease expired (their worker died or hung) go back to the queue,
or to failed once their attempts are used up; the attempt counts."""

from __future__ import annotations

from asyncq.store import Conn, Store
from asyncq.worker.observer import Observer

RESCUE_LIMIT = 1000


class Rescuer:
    name = "rescuer"

    def __init__(self, *, store: Store, interval: float, observer: Observer) -> None:
        self.store = store
        self.interval = interval
        self.observer = observer

    async def run(self, conn: Conn) -> bool:
        rescued = await self.store.reap_expired(conn, limit=RESCUE_LIMIT)
        if rescued:
            self.observer.rescued(rescued)
        return len(rescued) == RESCUE_LIMIT
