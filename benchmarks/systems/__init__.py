"""The systems under test. Each module holds both sides of one system:

- a `System` subclass the harness drives (schema, enqueue APIs, the SQL that tells
  when a drain is over), and
- ``async def work(options, ready)``, the worker that ``python -m benchmarks.worker``
  runs in its own process.

Peer libraries are imported lazily, so ``--only asyncq,sql`` runs without them.
``baseline`` is asyncq at another commit, added by ``--baseline REF`` (not by ``--only``).
``arq`` keeps its jobs in Redis, not PostgreSQL (``uses_postgres = False``); ``oban``
runs its workers and its enqueues under a Python 3.12 of its own (``interpreter``).
``redis`` is the bare Redis list loop of the shape benchmark (benchmarks/shape.py) and
has no `System` of its own.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# The pause before each pickup-latency job of a worker that wakes on a notification.
SHORT_GAP = (0.010, 0.020)
MODULES = {
    "asyncq": "benchmarks.systems.asyncq_system",
    "procrastinate": "benchmarks.systems.procrastinate_system",
    "pgqueuer": "benchmarks.systems.pgqueuer_system",
    "sql": "benchmarks.systems.sql_system",
    "baseline": "benchmarks.systems.baseline_system",
    "oban": "benchmarks.systems.oban_system",
    "saq": "benchmarks.systems.saq_system",
    "arq": "benchmarks.systems.arq_system",
    "redis": "benchmarks.systems.redis_list_system",
}
ORDER = ["asyncq", "procrastinate", "pgqueuer", "oban", "saq", "arq", "sql"]


@dataclass(frozen=True)
class Point:
    """One worker configuration: jobs run at once, jobs claimed per query (0: the system's
    own default), processes."""

    concurrency: int
    batch: int
    processes: int = 1
    variant: str = ""

    @property
    def label(self) -> str:
        text = f"c={self.concurrency} b={self.batch or 'default'}"
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


class Timed:
    """A one-by-one enqueue that the system times itself, in blocks: ``await run(n)`` makes
    ``n`` calls one after another and returns the seconds they took. For a system whose
    client runs in another process (oban), so that the pipe to it is not in each call."""

    def __init__(self, run: Callable[[int], Awaitable[float]]) -> None:
        self.run = run


async def time_calls(call: Callable[[], Awaitable[None]] | Timed, n: int) -> float:
    """Seconds taken by ``n`` calls of ``call``, one after another."""
    if isinstance(call, Timed):
        return await call.run(n)
    started = time.perf_counter()
    for _ in range(n):
        await call()
    return time.perf_counter() - started


# The probe's session: its polls (every 10 ms through a drain) read the systems' indexes,
# never the whole table. The planner costs these queries from the statistics of the
# pre-load, when every row was waiting: it expects the first row it reads to answer, and
# chooses a sequential scan (and for a second branch, parallel workers) that by the end of
# a drain reads every row of the table, up to tens of milliseconds of the server's CPU per
# poll, taken from the system it measures.
PROBE_SETTINGS = "SET enable_seqscan = off; SET max_parallel_workers_per_gather = 0; SET jit = off"


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
    # False for a system that keeps its jobs elsewhere (arq: Redis). Its ``dsn`` is then
    # where it does keep them, and it gets no database, ANALYZE or CHECKPOINT.
    uses_postgres = True
    # Set when the system has no batch API: what its "bulk" enqueue does instead.
    bulk_note: str | None = None

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._probe: Any = None

    def interpreter(self) -> str:
        """The Python that runs the system's worker processes."""
        return sys.executable

    async def unfinished(self) -> bool:
        """Whether jobs are still waiting or running (``unfinished_sql``)."""
        return bool(await self._probe_value(self.unfinished_sql))

    async def completed(self) -> int:
        """How many jobs completed successfully (``completed_sql``)."""
        return int(await self._probe_value(self.completed_sql) or 0)

    async def _probe_value(self, query: str) -> Any:
        if self._probe is None or self._probe.closed:
            from benchmarks.common import connect

            self._probe = await connect(self.dsn)
            await self._probe.execute(PROBE_SETTINGS)
        row = await (await self._probe.execute(query)).fetchone()
        return row[0] if row else None

    async def close_probe(self) -> None:
        if self._probe is not None:
            await self._probe.close()
            self._probe = None

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

    async def enqueue_concurrent(self, coroutines: int, each: int) -> float:
        """Seconds for ``coroutines`` coroutines to make ``each`` one-by-one enqueues each
        (after a warm-up of 20 at once)."""
        await self.enqueue_concurrent_setup(coroutines)
        try:

            async def producer() -> None:
                for _ in range(each):
                    await self.enqueue_concurrent_one()

            await asyncio.gather(*(self.enqueue_concurrent_one() for _ in range(20)))
            started = time.perf_counter()
            await asyncio.gather(*(producer() for _ in range(coroutines)))
            return time.perf_counter() - started
        finally:
            await self.enqueue_concurrent_teardown()

    def one_by_one(self) -> Callable[[], Awaitable[None]] | Timed:
        """The one-by-one enqueue as `measure.enqueue` times it (`enqueue_one` unless the
        system times its own calls)."""
        return self.enqueue_one

    def extra_enqueue(self) -> dict[str, Callable[[], Awaitable[None]] | Timed]:
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

    def latency_gap(self, point: Point) -> tuple[float, float]:
        """The pause before each pickup-latency job, drawn uniformly from this range (in
        seconds). A worker that polls every P seconds needs a range as wide as P: with a
        short pause each job would be sent just after the poll that picked up the last one,
        and wait nearly all of P every time."""
        return SHORT_GAP

    @staticmethod
    def default_point() -> Point | None:
        """The throughput configuration the system runs with when none is given (one of
        `sweep`'s), or None (the plain-SQL reference has no default)."""
        return None

    def drain_jobs(self, point: Point, jobs: int) -> int:
        """Jobs for a drain at ``point``: ``jobs``, or fewer where a configuration is so
        slow that ``jobs`` would take minutes (the report gives each drain's count)."""
        return jobs

    def latency_points(self) -> list[Point]:
        """Pickup latency configurations: `latency_point` first (the one in the summary),
        then others worth showing (arq at a shorter poll than its default)."""
        return [self.latency_point()]


def load(name: str) -> ModuleType:
    """The system's module; ImportError says what is missing."""
    return importlib.import_module(MODULES[name])
