"""Instructions per job, counted by callgrind: numbers the machine's noise does not move.

    python -m benchmarks.instructions [--baseline REF] [--jobs 3000] [--points 10x10,100x100]
                                      [--task noop|suspend] [--worker-only]

Two counts per version of asyncq (the working tree's, and REF's with ``--baseline``):

- **worker**: a worker process (``App.run_worker(drain=True)``, a no-op task) run under
  ``valgrind --tool=callgrind`` draining ``--jobs`` jobs, less the same process draining
  none, divided by the jobs: the worker's own CPU per job, at each concurrency x batch.
  ``--task suspend``: a task that suspends once (``await asyncio.sleep(0)``), as one that
  waits for anything does, instead of the no-op.
- **server**: a PostgreSQL of its own (the ``postgres`` binaries of ``pg_config``, a
  temporary data directory) run under callgrind, and one connection driving the claim and
  ``mark_done`` of that version's store, batch after batch: the instructions of that one
  backend per job, less a connection that claims nothing. The schema is each version's own
  (its migrations run on a database of its own).

On a 2-core machine a drain is bound by the sum of the two (the worker on one core, the
server on the other, each waiting for the other), so their sum predicts throughput.
Needs ``valgrind`` and PostgreSQL's server binaries; as root, the server runs as the
``postgres`` user. A count takes about ten seconds; the default run about three minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import baseline
from benchmarks.common import ROOT, recreate_database

NOOP = "bench.noop"
_TOTAL = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


@dataclass(frozen=True)
class Version:
    title: str
    package: str  # asyncq, or asyncq_baseline
    path: str  # for sys.path ("" for the working tree's)


# -- what runs under callgrind ------------------------------------------------------------


def _app(package: str, dsn: str, task: str = "noop") -> Any:
    import importlib

    app = importlib.import_module(package).App(dsn, application_name="asyncq-instructions")

    if task == "suspend":

        @app.task(name=NOOP)
        async def suspend() -> None:
            await asyncio.sleep(0)

    else:

        @app.task(name=NOOP)
        async def noop() -> None:
            return None

    return app


async def _fill(package: str, dsn: str, jobs: int) -> None:
    app = _app(package, dsn)
    async with app:
        await app.migrate()
        async with app.connection() as conn:
            await conn.execute("TRUNCATE asyncq_jobs RESTART IDENTITY")
        if jobs:
            await app.tasks[NOOP].defer_many([{}] * jobs)
        async with app.connection() as conn:
            await conn.execute("VACUUM ANALYZE asyncq_jobs")


async def _drain(package: str, dsn: str, concurrency: int, batch: int, task: str) -> None:
    app = _app(package, dsn, task)
    async with app:
        await app.run_worker(concurrency=concurrency, batch_size=batch, drain=True)


async def _cycle(package: str, dsn: str, batch: int, pid_file: str) -> None:
    """Claim and mark done, batch after batch, on one connection, through the store."""
    app = _app(package, dsn)
    async with app, app.connection() as conn:
        await conn.set_autocommit(True)
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        with open(pid_file, "w") as out:  # noqa: ASYNC230 - before the count begins
            out.write(str(row[0] if row else 0))
        store, lease = app.store, timedelta(seconds=60)
        while jobs := await store.claim(conn, worker="w", limit=batch, queues=None, lease=lease):
            await store.mark_done(conn, worker="w", jobs=jobs)


def _child(argv: list[str]) -> None:
    what, package, path, dsn, *rest = argv
    if path:
        sys.path.insert(0, path)
    if what == "fill":
        asyncio.run(_fill(package, dsn, int(rest[0])))
    elif what == "drain":
        asyncio.run(_drain(package, dsn, int(rest[0]), int(rest[1]), rest[2]))
    else:
        asyncio.run(_cycle(package, dsn, int(rest[0]), rest[1]))


# -- counting -----------------------------------------------------------------------------


def _python(what: str, version: Version, dsn: str, *args: object, valgrind: Path | None) -> None:
    command = [sys.executable, "-m", "benchmarks.instructions", "--child", what]
    command += [version.package, version.path, dsn, *map(str, args)]
    if valgrind is not None:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={valgrind}", *command]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} of {version.title} failed:\n{done.stderr[-2000:]}")


def _total(out: Path) -> int:
    found = _TOTAL.search(out.read_bytes())
    if found is None:
        raise RuntimeError(f"no total in {out}")
    return int(found.group(1))


def worker_per_job(
    version: Version, dsn: str, jobs: int, concurrency: int, batch: int, task: str, tmp: Path
) -> float:
    totals = []
    for count in (0, jobs):
        _python("fill", version, dsn, count, valgrind=None)
        out = tmp / f"worker-{os.getpid()}-{count}.out"
        _python("drain", version, dsn, concurrency, batch, task, valgrind=out)
        totals.append(_total(out))
    return (totals[1] - totals[0]) / jobs


class Server:
    """A PostgreSQL of this run's own, started under callgrind for each count."""

    def __init__(self, tmp: Path) -> None:
        done = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        self.bin = Path(done.stdout.strip())
        self.data = tmp / "pgdata"
        self.out = tmp / "server"
        self.port = 5400 + os.getpid() % 500
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        for path in (tmp, self.out):
            path.mkdir(exist_ok=True)
            path.chmod(0o777)
        self._run(self.bin / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{tmp}'\nautovacuum = off\n"
                "fsync = off\nsynchronous_commit = off\n"
            )

    def _run(self, *command: object) -> None:
        subprocess.run([*self.as_user, *map(str, command)], check=True, capture_output=True)

    def start(self, *, counted: bool) -> subprocess.Popen[bytes]:
        command = [*self.as_user]
        if counted:
            command += ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}/%p"]
        command += [str(self.bin / "postgres"), "-D", str(self.data)]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return server
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def stop(self, server: subprocess.Popen[bytes]) -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "stop", "-m", "fast")
        server.wait()

    def per_job(self, version: Version, dsn: str, jobs: int, batch: int) -> float:
        totals = []
        for count in (0, jobs):
            server = self.start(counted=True)
            pid_file = self.out / "pid"
            try:
                _python("fill", version, dsn, count, valgrind=None)
                _python("cycle", version, dsn, batch, pid_file, valgrind=None)
            finally:
                self.stop(server)
            totals.append(_total(self.out / pid_file.read_text()))
        return (totals[1] - totals[0]) / jobs


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    parser.add_argument("--baseline", help="a commit to count beside the working tree")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--points", default="10x10,100x100", help="concurrency x batch, ...")
    parser.add_argument(
        "--task", choices=("noop", "suspend"), default="noop", help="what each job does"
    )
    parser.add_argument(
        "--worker-only", action="store_true", help="count the worker, not the server"
    )
    args = parser.parse_args()
    for tool in ("valgrind", "pg_config"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is needed (apt-get install valgrind postgresql)")
    points = [tuple(int(n) for n in p.split("x")) for p in args.points.split(",")]
    with tempfile.TemporaryDirectory(prefix="asyncq-instructions-") as name:
        tmp = Path(name)
        tmp.chmod(0o755)  # for the server's user
        versions = [Version("working tree", "asyncq", "")]
        if args.baseline:
            made = baseline.extract(baseline.resolve(args.baseline), tmp)
            versions.append(Version(f"asyncq@{args.baseline}", baseline.PACKAGE, str(made.parent)))
        server = Server(tmp / "pg")
        running = server.start(counted=False)
        try:
            dsns = [asyncio.run(recreate_database(server.dsn, f"ins_{i}")) for i in range(2)]
        finally:
            server.stop(running)
        what = "no-op" if args.task == "noop" else "suspending"
        print(f"instructions per job ({args.jobs} {what} jobs, less none)")
        for version, dsn in zip(versions, dsns, strict=False):
            for concurrency, batch in points:
                running = server.start(counted=False)
                try:
                    worker = worker_per_job(
                        version, dsn, args.jobs, concurrency, batch, args.task, tmp
                    )
                finally:
                    server.stop(running)
                point = f"c={concurrency:<3} b={batch:<3}"
                line = f"{version.title:>22}  {point}  worker {worker:9,.0f}"
                if not args.worker_only:
                    on_server = server.per_job(version, dsn, args.jobs, batch)
                    line += f"  server {on_server:9,.0f}  sum {worker + on_server:9,.0f}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
