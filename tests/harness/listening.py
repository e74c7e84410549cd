"""When a worker run in the test's own process listens, known rather than slept for:
`Listening` hears of each LISTEN connection that the workers of its App make."""

from __future__ import annotations

import asyncq
from asyncq.worker.observer import Observer
from tests.harness.waiting import until


class Listening(Observer):
    def __init__(self, app: asyncq.App) -> None:
        self.connected = 0
        app._observers.append(self)

    def listener_connected(self, reconnected: bool) -> None:
        self.connected += 1

    async def until_listening(self) -> None:
        """Until a worker of the App has run its LISTEN (it wakes on notifications now)."""
        await until(lambda: self.connected, what="the worker to listen")
