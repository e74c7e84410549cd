"""Absurd in the workflow benchmark (benchmarks/workflows.py): its tasks, the harness's side,
and the worker process (``python -m benchmarks.workflows_absurd --dsn DSN --concurrency C
--poll SECONDS``).

Absurd is SQL (``sql/absurd.sql`` of https://github.com/earendil-works/absurd, loaded
into its database from ``--absurd-sql``: that file, or a clone of the repository, or its
bare git directory; it is not part of this repository) and a client library
(``pip install absurd-sdk``). Its worker claims with a poll, every
``poll_interval`` (0.25 s by default) while nothing is ready, on one connection per client
that every task it runs shares.

- ``wf3``: a task of three no-op steps (``ctx.step`` of a coroutine returning None);
- ``child``: a task of no step, the plain jobs and the children alike (queue ``children``);
- ``fanout``: spawns ``n`` children (in one step that records their ids) and waits for
  each one's result with ``ctx.await_task_result``, Absurd's way to wait for another task
  (it must be on another queue; it polls, 50 ms doubling to 1 s, holding the slot);
- ``waiter``: ``ctx.await_event(key)``, then reports the time since the payload.

One process runs a worker on the queue ``default`` and one on ``children``, each at
``--concurrency`` and ``--poll``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import connect, report_latency, run_async

QUEUES = ("default", "children")
SPAWNERS = 8  # connections the harness spawns its bursts on


HOW = (
    "git clone https://github.com/earendil-works/absurd and give --absurd-sql"
    " absurd/sql/absurd.sql (and pip install absurd-sdk)"
)


def load_sql(source: str | None) -> tuple[str, str]:
    """Absurd's SQL from ``source`` (the file, a clone, or a git directory), and where it
    came from (with the commit, for a repository). `FileNotFoundError` says how to get it."""
    if not source:
        raise FileNotFoundError(f"Absurd's SQL not given: {HOW}")
    path = Path(source)
    if path.is_file():
        text = path.read_text()
        return text, f"{path} (sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]})"
    if (path / "sql" / "absurd.sql").is_file():
        text = (path / "sql" / "absurd.sql").read_text()
        return text, f"{path / 'sql' / 'absurd.sql'} (commit {_commit(path / '.git')})"
    if path.is_dir():
        shown = subprocess.run(
            ["git", "--git-dir", str(path), "show", "HEAD:sql/absurd.sql"],
            capture_output=True,
            text=True,
        )
        if shown.returncode == 0:
            return shown.stdout, f"sql/absurd.sql at commit {_commit(path)}"
    raise FileNotFoundError(f"no Absurd SQL at {source}: {HOW}")


def _commit(git_dir: Path) -> str:
    done = subprocess.run(
        ["git", "--git-dir", str(git_dir), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "?"


def missing() -> str | None:
    """Why Absurd's client cannot run here, or None."""
    try:
        import absurd_sdk  # noqa: F401
    except ImportError:
        return f"absurd-sdk is not installed: pip install absurd-sdk ({HOW})"
    return None


def version() -> str:
    from importlib.metadata import version as of

    return of("absurd-sdk")


class AbsurdWorkflows:
    """The harness's side: clients to spawn and emit with, and the probes."""

    name = "absurd"
    module = "benchmarks.workflows_absurd"

    def __init__(self, dsn: str, sql: str) -> None:
        self.dsn = dsn
        self.sql = sql
        self.clients: list[Any] = []
        self.probe: Any = None

    def worker_args(self, concurrency: int, poll: float) -> list[str]:
        return ["--dsn", self.dsn, "--concurrency", str(concurrency), "--poll", str(poll)]

    async def install(self) -> None:
        async with await connect(self.dsn) as conn:
            await conn.execute(self.sql)
            for queue in QUEUES:
                await conn.execute("SELECT absurd.create_queue(%s)", (queue,))

    async def open(self) -> None:
        from absurd_sdk import AsyncAbsurd

        self.clients = [AsyncAbsurd(self.dsn, queue_name="default") for _ in range(SPAWNERS)]
        self.probe = await connect(self.dsn)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        if self.probe is not None:
            await self.probe.close()

    async def reset(self) -> None:
        tables = ", ".join(f"absurd.{t}_{q}" for q in QUEUES for t in "trcew")
        async with await connect(self.dsn) as conn:
            await conn.execute(f"TRUNCATE {tables}")
            await conn.execute("CHECKPOINT")

    async def value(self, query: str, *params: Any) -> Any:
        row = await (await self.probe.execute(query, params)).fetchone()
        return row[0] if row else None

    async def completed(self, queue: str) -> int:
        found = await self.value(f"SELECT count(*) FROM absurd.t_{queue} WHERE state = 'completed'")
        return int(found)

    async def steps(self) -> int:
        return int(await self.value("SELECT count(*) FROM absurd.c_default"))

    # -- shapes ----------------------------------------------------------------------

    async def spawn(self, task: str, n: int, params: dict[str, Any] | None = None) -> list[str]:
        """``n`` tasks, one call each (Absurd has no batch spawn), on `SPAWNERS` clients."""
        queue = "children" if task == "child" else "default"
        ids: list[str] = []

        async def spawner(client: Any, count: int) -> None:
            for _ in range(count):
                spawned = await client.spawn(task, params or {}, queue=queue)
                ids.append(str(spawned["task_id"]))

        shares = [n // SPAWNERS + (1 if i < n % SPAWNERS else 0) for i in range(SPAWNERS)]
        await asyncio.gather(*(spawner(c, k) for c, k in zip(self.clients, shares, strict=True)))
        return ids

    async def state(self, task_id: str) -> str | None:
        found = await self.value("SELECT state FROM absurd.t_default WHERE task_id = %s", task_id)
        return None if found is None else str(found)

    async def waiting(self, task_id: str) -> bool:
        return await self.state(task_id) == "sleeping"

    async def emit(self, key: str, sent_at: float) -> None:
        await self.clients[0].emit_event(key, sent_at)

    async def result(self, task_id: str) -> Any:
        return await self.value(
            "SELECT completed_payload FROM absurd.t_default WHERE task_id = %s", task_id
        )


# -- the worker process ------------------------------------------------------------------


def make_apps(dsn: str) -> dict[str, Any]:
    from absurd_sdk import AsyncAbsurd

    apps = {queue: AsyncAbsurd(dsn, queue_name=queue) for queue in QUEUES}
    main, children = apps["default"], apps["children"]

    async def nothing() -> None:
        return None

    @children.register_task("child")
    async def child(params: Any, ctx: Any) -> None:
        return None

    @main.register_task("wf3")
    async def wf3(params: Any, ctx: Any) -> None:
        await ctx.step("one", nothing)
        await ctx.step("two", nothing)
        await ctx.step("three", nothing)

    @main.register_task("fanout")
    async def fanout(params: Any, ctx: Any) -> int:
        async def spawn_all() -> list[str]:
            spawned = [await main.spawn("child", {}, queue="children") for _ in range(params["n"])]
            return [str(s["task_id"]) for s in spawned]

        ids = await ctx.step("spawn", spawn_all)
        for task_id in ids:
            await ctx.await_task_result(task_id, queue_name="children")
        return len(ids)

    @main.register_task("waiter")
    async def waiter(params: Any, ctx: Any) -> None:
        sent_at = await ctx.await_event(params["key"])
        report_latency(sent_at)

    return apps


async def serve(args: argparse.Namespace) -> None:
    apps = make_apps(args.dsn)
    for app in apps.values():
        await app._ensure_connected()
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, input)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: [app.stop_worker() for app in apps.values()])
    await asyncio.gather(
        *(
            app.start_worker(concurrency=args.concurrency, poll_interval=args.poll)
            for app in apps.values()
        )
    )
    for app in apps.values():
        await app.close()
    print("EXIT", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows_absurd")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--poll", type=float, default=0.25)
    args = parser.parse_args()
    run_async(lambda: serve(args))


if __name__ == "__main__":
    main()
