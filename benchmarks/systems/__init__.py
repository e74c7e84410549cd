"""The systems under test. Each module holds both sides of one system:

- a `System` subclass the harness drives (schema, enqueue APIs, the SQL that tells
  when a drain is over), and
- ``async def work(options, ready)``, the worker that ``python -m benchmarks.worker``
  runs in its own process.

Peer libraries are imported lazily, so ``--only asyncq,sql`` runs without them.
``baseline`` is asyncq at another commit, added by ``--baseline REF`` (not by ``--only``).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

MODULES = {
    "asyncq": "benchmarks.systems.asyncq_system",
    "procrastinate": "benchmarks.systems.procrastinate_system",
    "pgqueuer": "benchmarks.systems.pgqueuer_system",
    "sql": "benchmarks.systems.sql_system",
    "baseline": "benchmarks.systems.baseline_system",
}
ORDER = ["asyncq", "procrastinate", "pgqueuer", "sql"]


@dataclass(frozen=True)
class Point:
    """One worker configuration: jobs run at once, jobs claimed per query, processes."""

    concurrency: int
    batch: int
    processes: int = 1
    variant: str = ""

    @property
    def label(self) -> str:
        text = f"c={self.concurrency} b={self.batch}"
        if self.processes > 1:
            text += f" x{self.processes} proc"
        return f"{text} {self.variant}".strip()


@dataclass(frozen=True)
class WorkerOptions:
    """What the harness tells a worker process (see benchmarks/worker.py)."""

    dsn: str
    mode: str  # "drain" (process the backlog, then exit) or "serve" (until SIGTERM)
    concurrency: int
    batch: int
    variant: str = ""


Ready = Callable[[], Awaitable[None]]


class System(ABC):
    """The harness's side of one system, bound to that system's own database."""

    name: str
    title: str
    # The truth of this query says that jobs are still waiting or running.
    unfinished_sql: str
    # How many jobs have completed successfully.
    completed_sql: str
    # Tables to ANALYZE after a pre-load, as autovacuum would.
    tables: tuple[str, ...]
    supports_concurrent_enqueue = True

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    @abstractmethod
    async def install(self) -> None:
        """Create the schema in the (fresh) database."""

    @abstractmethod
    async def open(self) -> None:
        """Open the client the harness enqueues with."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def reset(self) -> None:
        """Empty the job tables."""

    @abstractmethod
    async def enqueue_bulk(self, count: int) -> None:
        """Write ``count`` no-op jobs with the system's batch API, in one call."""

    @abstractmethod
    async def enqueue_one(self) -> None:
        """Write one no-op job in its own transaction."""

    @abstractmethod
    async def enqueue_stamp(self, sent_at: float) -> None:
        """Write one pickup-latency job carrying ``sent_at`` (time.time())."""

    async def enqueue_concurrent_setup(self, coroutines: int) -> None:  # noqa: B027 - optional
        """Prepare for ``coroutines`` concurrent enqueuers (e.g. a pool)."""

    async def enqueue_concurrent_one(self) -> None:
        await self.enqueue_one()

    async def enqueue_concurrent_teardown(self) -> None:  # noqa: B027 - optional
        """Undo `enqueue_concurrent_setup`."""

    def extra_enqueue(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """More one-by-one enqueue variants worth reporting, by name."""
        return {}

    def in_turns(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """The one-by-one calls to time in turns with another system's own, when paired
        with it (``--baseline``: the baseline's defers, in asyncq's enqueue phase)."""
        return {"one_by_one": self.enqueue_one}

    def import_path(self) -> str | None:
        """A directory the worker processes need on sys.path, if any."""
        return None

    def code(self) -> Path | None:
        """The directory of the code under test, where it matters which copy runs."""
        return None

    @staticmethod
    @abstractmethod
    def sweep(quick: bool) -> list[Point]:
        """The throughput configurations to measure."""

    @staticmethod
    @abstractmethod
    def latency_point() -> Point:
        """The configuration of the idle worker whose pickup latency is measured."""


def load(name: str) -> ModuleType:
    """The system's module; ImportError says what is missing."""
    return importlib.import_module(MODULES[name])
