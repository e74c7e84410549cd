"""What the harness and the worker processes share: DSNs, databases, statistics, processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
# $ASYNCQ_BENCH_DB_PREFIX: another prefix, for two runs on one server at once.
DB_PREFIX = os.environ.get("ASYNCQ_BENCH_DB_PREFIX", "asyncq_bench_")

# asyncq's reference for its one-by-one defers: a plain INSERT timed in turns with them,
# on a connection of its own (a connection used more often answers faster).
PLAIN_INSERT_LABEL = "plain INSERT (in turns with defer)"
# And the INSERT of the row a defer writes (the same five columns), on a third connection.
SAME_ROW_LABEL = "INSERT of the same row (in turns with defer)"
# asyncq's defer on a connection the caller passes (``options(conn=...)``).
OWN_CONNECTION_LABEL = "defer(conn=own connection)"


# -- running coroutines -----------------------------------------------------------------


def run_async(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` on uvloop when it is installed (as every system here can), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())  # type: ignore[arg-type]
    return uvloop.run(main())  # type: ignore[arg-type]


# -- connection strings ------------------------------------------------------------------


def with_dbname(dsn: str, dbname: str) -> str:
    """The same server and credentials as ``dsn``, another database."""
    return make_conninfo(dsn, dbname=dbname)


def asyncpg_kwargs(dsn: str) -> dict[str, Any]:
    """``dsn`` as keyword arguments for ``asyncpg.connect`` (which reads only URLs)."""
    parts = conninfo_to_dict(dsn)
    mapping = {"host": "host", "port": "port", "user": "user", "password": "password"}
    kwargs: dict[str, Any] = {key: parts[name] for name, key in mapping.items() if parts.get(name)}
    if "port" in kwargs:
        kwargs["port"] = int(kwargs["port"])
    kwargs["database"] = parts.get("dbname", "postgres")
    return kwargs


def describe(dsn: str) -> str:
    parts = conninfo_to_dict(dsn)
    host = str(parts.get("host") or "localhost")
    where = host if host.startswith("/") else f"{host}:{parts.get('port') or 5432}"
    return f"postgresql://{parts.get('user', '')}@{where}/{parts.get('dbname', '')}"


async def connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


# -- databases ---------------------------------------------------------------------------


async def recreate_database(admin_dsn: str, name: str) -> str:
    """Drop and create the database ``asyncq_bench_<name>``; returns its DSN."""
    dbname = DB_PREFIX + name
    async with await connect(admin_dsn) as conn:
        ident = sql.Identifier(dbname)
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    return with_dbname(admin_dsn, dbname)


async def drop_database(admin_dsn: str, name: str) -> None:
    async with await connect(admin_dsn) as conn:
        ident = sql.Identifier(DB_PREFIX + name)
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


async def server_facts(dsn: str) -> dict[str, str]:
    """The server's version and the settings that decide commit and cache costs."""
    names = ["server_version", "synchronous_commit", "fsync", "wal_sync_method"]
    names += ["shared_buffers", "max_connections", "autovacuum", "jit"]
    facts: dict[str, str] = {}
    async with await connect(dsn) as conn:
        for name in names:
            row = await (
                await conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name)))
            ).fetchone()
            facts[name] = str(row[0]) if row else "?"
    return facts


# -- statistics --------------------------------------------------------------------------


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- worker processes --------------------------------------------------------------------


@dataclass
class WorkerProcess:
    """A worker in its own process, spoken to through its stdin and stdout.

    Protocol: the worker prints ``READY`` once connected, waits for a line on stdin
    before it starts, prints ``L <seconds>`` for each pickup-latency job it runs,
    and ``EXIT`` when its worker returns. asyncq's workers also print ``CODE <file>``,
    the file their App comes from. Any other line goes to `lines` (the workflow
    benchmark's workers answer commands written to their stdin, `send`).
    """

    proc: asyncio.subprocess.Process
    stderr_path: Path
    code: str | None = None
    latencies: asyncio.Queue[float] = field(default_factory=asyncio.Queue)
    lines: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    exited_at: float | None = None  # perf_counter time when ``EXIT`` was read
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        args: Sequence[str],
        stderr_path: Path,
        wrapper: Sequence[str] = (),
        python: str | None = None,
        module: str = "benchmarks.worker",
    ) -> WorkerProcess:
        """Start ``python -m benchmarks.worker ARGS``, under ``wrapper`` (a profiler) if given;
        ``python``: another interpreter than this one (oban's Python 3.12); ``module``:
        another module than benchmarks.worker that speaks the same protocol."""
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with stderr_path.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *wrapper,
                python or sys.executable,
                "-m",
                module,
                *args,
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        worker = cls(proc=proc, stderr_path=stderr_path)
        worker._reader = asyncio.create_task(worker._read())
        return worker

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line == "READY":
                self.ready.set()
            elif line.startswith("L "):
                self.latencies.put_nowait(float(line[2:]))
            elif line == "EXIT":
                self.exited_at = time.perf_counter()
                self.exited.set()
            elif line.startswith("CODE "):
                self.code = line[5:]
            else:
                self.lines.put_nowait(line)

    async def wait_ready(self, within: float = 60.0) -> None:
        waiter = asyncio.create_task(self.ready.wait())
        dead = asyncio.create_task(self.proc.wait())
        await asyncio.wait({waiter, dead}, timeout=within, return_when="FIRST_COMPLETED")
        waiter.cancel()
        dead.cancel()
        if not self.ready.is_set():
            raise RuntimeError(f"worker did not start: {self.error_tail()}")

    def go(self) -> None:
        self.send("go")

    def send(self, line: str) -> None:
        """Write ``line`` to the worker's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    async def next_line(self, within: float) -> str:
        """The next line of the worker's that the protocol above does not name."""
        getter = asyncio.create_task(self.lines.get())
        dead = asyncio.create_task(self.proc.wait())
        await asyncio.wait({getter, dead}, timeout=within, return_when="FIRST_COMPLETED")
        dead.cancel()
        if getter.done():
            return getter.result()
        getter.cancel()
        if self.proc.returncode is not None:
            raise RuntimeError(f"worker exited: {self.error_tail()}")
        raise TimeoutError(f"no line from the worker within {within:.0f}s")

    async def next_latency(self, within: float) -> float:
        getter = asyncio.create_task(self.latencies.get())
        dead = asyncio.create_task(self.proc.wait())
        await asyncio.wait({getter, dead}, timeout=within, return_when="FIRST_COMPLETED")
        dead.cancel()
        if getter.done():
            return getter.result()
        getter.cancel()
        if self.proc.returncode is not None:
            raise RuntimeError(f"worker exited: {self.error_tail()}")
        raise TimeoutError(f"no pickup within {within:.0f}s")

    async def wait_exit(self, within: float) -> int | None:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self.proc.wait(), within)
        return None

    async def wait_drained(self, within: float) -> float:
        """Wait for ``EXIT`` (a drain-mode worker's: nothing left to claim, every outcome
        written); the perf_counter time it was read."""
        waiter = asyncio.create_task(self.exited.wait())
        dead = asyncio.create_task(self.proc.wait())
        await asyncio.wait({waiter, dead}, timeout=within, return_when="FIRST_COMPLETED")
        dead.cancel()
        if self.exited_at is None and dead.done():
            # The process may end just before its reader has read the line.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, 2.0)
        waiter.cancel()
        if self.exited_at is not None:
            return self.exited_at
        if self.proc.returncode is not None:
            raise RuntimeError(f"worker exited without draining: {self.error_tail()}")
        raise TimeoutError(f"worker still draining after {within:.0f}s")

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            if await self.wait_exit(grace) is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 2.0)

    def error_tail(self, lines: int = 8) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no stderr)"
        return " | ".join(text[-lines:]) or f"exit code {self.proc.returncode}"


@contextlib.asynccontextmanager
async def workers(
    args: Sequence[str],
    count: int,
    log_dir: Path,
    tag: str,
    wrapper: Sequence[str] = (),
    python: str | None = None,
    module: str = "benchmarks.worker",
) -> AsyncIterator[list[WorkerProcess]]:
    """``count`` worker processes, all READY; stopped on the way out."""
    started: list[WorkerProcess] = []
    try:
        for i in range(count):
            path = log_dir / f"{tag}-{i}.stderr"
            started.append(await WorkerProcess.start(args, path, wrapper, python, module))
        for worker in started:
            await worker.wait_ready()
        yield started
    finally:
        for worker in started:
            await worker.stop()


async def wait_until_false(
    conn: psycopg.AsyncConnection[Any], query: str, *, interval: float, within: float
) -> float:
    """Poll ``query`` (one boolean) until it is false; returns the perf_counter time then."""
    deadline = time.perf_counter() + within
    while True:
        row = await (await conn.execute(query)).fetchone()
        now = time.perf_counter()
        if row is not None and not row[0]:
            return now
        if now > deadline:
            raise TimeoutError(f"still true after {within:.0f}s: {query}")
        await asyncio.sleep(interval)


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` from /proc (Linux), in bytes."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


async def until_signalled() -> None:
    """Return on SIGTERM or SIGINT (how the harness stops a serving worker)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def until_drained(dsn: str, query: str, interval: float = 0.05) -> None:
    """Return once ``query`` (one boolean: jobs still waiting or running) is false: the drain
    mode of a worker whose library has none. Polled on a connection of its own."""
    async with await connect(dsn) as conn:
        while True:
            row = await (await conn.execute(query)).fetchone()
            if row is not None and not row[0]:
                return
            await asyncio.sleep(interval)


def report_latency(sent_at: float) -> None:
    """Called first thing in a pickup-latency task body: tell the harness how long it took."""
    print(f"L {time.time() - sent_at:.6f}", flush=True)
