"""oban-py (PyPI: ``oban``): Oban's Python port, on psycopg; it needs Python 3.12 or newer.

The harness runs on this virtualenv's Python (3.11 will do), so oban gets a virtualenv of
its own, ``benchmarks/.venv-oban`` (not tracked by git), made on first use from a Python
3.12+ (``$BENCH_OBAN_PYTHON``, else ``python3.13``/``python3.12`` on the PATH, else one of
pyenv's) with `REQUIREMENTS` installed; it is made again when they change. Both oban's
worker processes and its enqueues run on that Python:

- workers: ``python -m benchmarks.worker oban ...`` as for every system, on that Python;
- enqueues: one client process (``--mode client``), an ``Oban`` in client mode (no
  queues) on a pool of 10 connections, that takes one JSON request a line on stdin and
  answers ``R <json>`` on stdout. It times its own calls (one by one in blocks, from 50
  coroutines, one ``enqueue_many`` call), so the pipe is outside the timed part; a
  pickup-latency job carries the client's ``time.time()`` read just before its enqueue.

A queue's ``limit`` is the concurrency; oban has no batch size (a fetch asks for as many
jobs as slots are free). Its producer acknowledges finished jobs in batches before its
next fetch. oban has no drain mode: a draining worker starts with its queue paused,
resumes it when the harness says go, and stops once no job is available or executing.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, report_latency, until_drained, until_signalled
from benchmarks.systems import Point, Ready, System, Timed, WorkerOptions

QUEUE = "default"
VENV = ROOT / "benchmarks" / ".venv-oban"
REQUIREMENTS = ("oban>=0.7,<0.8", "psycopg[binary]>=3.2", "uvloop>=0.19")
MARKER = "bench-requirements.txt"
UNFINISHED = (
    "SELECT EXISTS (SELECT 1 FROM oban_jobs"
    " WHERE state IN ('available', 'executing', 'scheduled', 'retryable'))"
)


# -- the virtualenv ----------------------------------------------------------------------


def _version_ok(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == "True"


def find_python() -> str:
    """A Python 3.12 or newer to make the virtualenv with; RuntimeError says where it looked."""
    candidates = []
    if os.environ.get("BENCH_OBAN_PYTHON"):
        candidates.append(os.environ["BENCH_OBAN_PYTHON"])
    # The oldest that will do first: the nearest to the harness's own Python.
    for name in ("python3.12", "python3.13", "python3.14"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(f"{pyenv}/versions/3.1[2-9]*/bin/python"))
    for python in candidates:
        if _version_ok(python):
            return python
    raise RuntimeError(
        "oban needs Python 3.12 or newer and none was found ($BENCH_OBAN_PYTHON,"
        f" python3.12+ on the PATH, {pyenv}/versions/3.12*): set BENCH_OBAN_PYTHON"
    )


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(say: Any = print) -> str:
    """The virtualenv's Python, made (or brought up to `REQUIREMENTS`) if need be."""
    python = venv_python()
    marker = VENV / MARKER
    wanted = "\n".join(REQUIREMENTS) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return str(python)
    if not python.exists():
        base = find_python()
        say(f"  oban: making {VENV.relative_to(ROOT)} with {base}")
        subprocess.run([base, "-m", "venv", str(VENV)], check=True, capture_output=True)
    say(f"  oban: pip install {' '.join(REQUIREMENTS)}")
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *REQUIREMENTS,
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        raise RuntimeError(f"pip install into {VENV} failed: {tail}")
    marker.write_text(wanted)
    return str(python)


def oban_version(python: str) -> str | None:
    """oban's version and the Python it runs on, e.g. ``0.7.0 (Python 3.12.1)``."""
    code = (
        "import importlib.metadata as m, platform;"
        " print(m.version('oban'), f'(Python {platform.python_version()})')"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or None


# -- the workers (plain classes, made oban workers on the 3.12 side by `_register`) -------


class Noop:
    async def process(self, job: Any) -> None:
        return None


class Stamp:
    async def process(self, job: Any) -> None:
        report_latency(float(job.args["sent_at"]))


class SleepFor:
    async def process(self, job: Any) -> None:
        await asyncio.sleep(float(job.args["seconds"]))


_registered = False


def _register() -> None:
    """Decorate the worker classes with oban's ``@worker`` (which changes them in place and
    registers them by ``benchmarks.systems.oban_system.<name>``)."""
    global _registered
    if _registered:
        return
    from oban import worker

    for cls in (Noop, Stamp, SleepFor):
        worker(queue=QUEUE)(cls)
    _registered = True


# -- the harness's side ------------------------------------------------------------------


class ObanClient:
    """The client process: requests and answers, one JSON line each."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self.lock = asyncio.Lock()

    @classmethod
    async def start(cls, python: str, dsn: str, stderr_path: Path) -> ObanClient:
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with stderr_path.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                python,
                "-m",
                "benchmarks.worker",
                "oban",
                "--dsn",
                dsn,
                "--mode",
                "client",
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        client = cls(proc, stderr_path)
        await client.request({"op": "ping"}, within=60)
        return client

    def tail(self) -> str:
        try:
            lines = self.stderr_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no stderr)"
        return " | ".join(lines[-6:]) or f"exit code {self.proc.returncode}"

    async def request(self, message: dict[str, Any], within: float = 300) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        async with self.lock:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            await self.proc.stdin.drain()
            while True:
                line = await asyncio.wait_for(self.proc.stdout.readline(), within)
                if not line:
                    raise RuntimeError(f"oban client exited: {self.tail()}")
                text = line.decode(errors="replace").strip()
                if text.startswith("R "):
                    answer: dict[str, Any] = json.loads(text[2:])
                    if "error" in answer:
                        raise RuntimeError(f"oban client: {answer['error']}")
                    return answer

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(RuntimeError, TimeoutError, ConnectionError):
                await self.request({"op": "quit"}, within=30)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class ObanSystem(System):
    name = "oban"
    title = "oban-py"
    unfinished_sql = UNFINISHED
    completed_sql = "SELECT count(*) FROM oban_jobs WHERE state = 'completed'"
    tables = ("oban_jobs",)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.python: str | None = None
        self.client: ObanClient | None = None
        self.version: str | None = None

    def interpreter(self) -> str:
        assert self.python is not None
        return self.python

    async def _client(self) -> ObanClient:
        if self.python is None:
            self.python = await asyncio.to_thread(ensure_venv)
            self.version = oban_version(self.python)
        if self.client is None:
            log = ROOT / "benchmarks" / "results" / "logs" / "oban-client.stderr"
            self.client = await ObanClient.start(self.python, self.dsn, log)
        return self.client

    async def install(self) -> None:
        await (await self._client()).request({"op": "install"})

    async def open(self) -> None:
        await self._client()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def reset(self) -> None:
        from benchmarks.common import connect

        async with await connect(self.dsn) as conn:
            await conn.execute("TRUNCATE oban_jobs, oban_producers, oban_leaders RESTART IDENTITY")

    async def _timed(self, op: str, **fields: Any) -> float:
        answer = await (await self._client()).request({"op": op, **fields})
        return float(answer["seconds"])

    async def enqueue_bulk(self, count: int) -> None:
        await self._timed("bulk", n=count)

    async def enqueue_sleep_bulk(self, count: int, seconds: float) -> None:
        await self._timed("bulk", n=count, seconds=seconds)

    async def enqueue_one(self) -> None:
        await self._timed("one", n=1)

    def one_by_one(self) -> Timed:
        return Timed(lambda n: self._timed("one", n=n))

    async def enqueue_concurrent(self, coroutines: int, each: int) -> float:
        return await self._timed("concurrent", coroutines=coroutines, each=each)

    async def enqueue_stamp(self, sent_at: float) -> None:
        # The client reads the clock itself, just before its enqueue: the pipe to it is not
        # part of the pickup time, as no enqueue call of the other systems crosses one.
        await (await self._client()).request({"op": "stamp"})

    @staticmethod
    def sweep(quick: bool) -> list[Point]:
        return [Point(c, 1) for c in ((10, 100) if quick else (10, 50, 100, 200))]

    @staticmethod
    def default_point() -> Point:
        return Point(10, 1)

    @staticmethod
    def latency_point() -> Point:
        return Point(10, 1)


SYSTEM = ObanSystem


# -- the 3.12 side: worker and client ----------------------------------------------------

NODE = f"bench-{os.getpid()}"


async def work(options: WorkerOptions, ready: Ready) -> None:
    from oban import Oban

    _register()
    drain = options.mode == "drain"
    pool = await Oban.create_pool(options.dsn)
    queue = {"limit": options.concurrency, "paused": drain}
    try:
        async with Oban(pool=pool, node=NODE, queues={QUEUE: queue}) as oban:
            await ready()
            if drain:
                await oban.resume_queue(QUEUE, node=NODE)
                await until_drained(options.dsn, UNFINISHED)
            else:
                await until_signalled()
    finally:
        await pool.close()


async def client(options: WorkerOptions) -> None:
    """Answer the harness's requests until ``quit`` (see `ObanClient`)."""
    from oban import Oban
    from oban.schema import install

    _register()
    loop = asyncio.get_running_loop()
    pool = await Oban.create_pool(options.dsn, min_size=1, max_size=10)
    oban: Any = None

    def answer(message: dict[str, Any]) -> None:
        sys.stdout.write("R " + json.dumps(message) + "\n")
        sys.stdout.flush()

    async def enqueue_each(count: int) -> None:
        for _ in range(count):
            await oban.enqueue(Noop.new())  # type: ignore[attr-defined]

    async def handle(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal oban
        op = request["op"]
        if op == "ping":
            return {"ok": True}
        if op == "install":
            await install(pool)
            return {"ok": True}
        if oban is None:  # started once its tables are there (its stager reads them)
            oban = await Oban(pool=pool).start()
        if op == "stamp":
            await oban.enqueue(Stamp.new({"sent_at": time.time()}))  # type: ignore[attr-defined]
            return {"ok": True}
        if op == "one":
            started = time.perf_counter()
            await enqueue_each(request["n"])
            return {"seconds": time.perf_counter() - started}
        if op == "bulk":
            n = request["n"]
            if "seconds" in request:
                args = {"seconds": request["seconds"]}
                jobs = [SleepFor.new(args) for _ in range(n)]  # type: ignore[attr-defined]
            else:
                jobs = [Noop.new() for _ in range(n)]  # type: ignore[attr-defined]
            started = time.perf_counter()
            await oban.enqueue_many(jobs)
            return {"seconds": time.perf_counter() - started}
        if op == "concurrent":
            await asyncio.gather(*(enqueue_each(1) for _ in range(20)))  # warm-up
            started = time.perf_counter()
            await asyncio.gather(
                *(enqueue_each(request["each"]) for _ in range(request["coroutines"]))
            )
            return {"seconds": time.perf_counter() - started}
        return {"error": f"unknown op {op!r}"}

    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            request = json.loads(line)
            if request["op"] == "quit":
                answer({"ok": True})
                return
            try:
                answer(await handle(request))
            except Exception as exc:  # noqa: BLE001 - reported to the harness
                answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        if oban is not None:
            await oban.stop()
        await pool.close()
