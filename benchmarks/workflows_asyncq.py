"""asyncq in the workflow benchmark (benchmarks/workflows.py): its App and tasks, the
harness's side, and the worker process (``python -m benchmarks.workflows_asyncq --dsn DSN
--concurrency C [--batch B]``, the protocol of `benchmarks.common.WorkerProcess`).

- ``bench.wf3``: a workflow of three no-op steps (``ctx.step`` of a function that returns
  None), one job;
- ``bench.noop``: a no-op job, the plain jobs and the children alike;
- ``bench.fanout``: spawns ``n`` children of ``bench.noop`` in one ``spawn_many`` and
  gathers them;
- ``bench.waiter``: waits for the event ``key``; when it runs again with the payload (the
  emitter's ``time.time()``), it reports the time since, first thing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import asyncq
from benchmarks.common import connect, report_latency, run_async

WF3 = "bench.wf3"
NOOP = "bench.noop"
FANOUT = "bench.fanout"
WAITER = "bench.waiter"
TABLES = "asyncq_jobs, asyncq_steps, asyncq_events, asyncq_waits"
# Jobs not ended: each branch reads an index of its own (ready, leases, waiting_for).
UNFINISHED = (
    "SELECT EXISTS (SELECT 1 FROM asyncq_jobs WHERE status = 'queued')"
    " OR EXISTS (SELECT 1 FROM asyncq_jobs WHERE expires_at IS NOT NULL AND status = 'running')"
    " OR EXISTS (SELECT 1 FROM asyncq_jobs WHERE status = 'waiting' AND waiting_for IS NOT NULL)"
)


def nothing() -> None:
    return None


def make_app(dsn: str) -> asyncq.App:
    app = asyncq.App(dsn, application_name="asyncq-bench-wf")

    @app.task(name=NOOP)
    async def noop() -> None:
        pass

    @app.task(name=WF3)
    async def wf3() -> None:
        ctx = asyncq.current_job()
        await ctx.step("one", nothing)
        await ctx.step("two", nothing)
        await ctx.step("three", nothing)

    @app.task(name=FANOUT)
    async def fanout(n: int) -> int:
        ctx = asyncq.current_job()
        ids = await ctx.spawn_many(noop, [{}] * n)
        return len(await ctx.gather(ids))

    @app.task(name=WAITER)
    async def waiter(key: str) -> None:
        sent_at = await asyncq.current_job().wait_for_event(key)
        report_latency(sent_at)

    return app


class AsyncqWorkflows:
    """The harness's side: the App it defers and emits with, and the probes."""

    name = "asyncq"
    module = "benchmarks.workflows_asyncq"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.app = make_app(dsn)
        self.probe: Any = None

    async def install(self) -> None:
        async with self.app:
            await self.app.migrate()

    async def open(self) -> None:
        await self.app.open()
        self.probe = await connect(self.dsn)
        # The probe's polls read the indexes (see benchmarks/systems PROBE_SETTINGS).
        await self.probe.execute("SET enable_seqscan = off; SET jit = off")

    async def close(self) -> None:
        if self.probe is not None:
            await self.probe.close()
        await self.app.close()

    async def reset(self) -> None:
        async with await connect(self.dsn) as conn:
            await conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY")
            await conn.execute("CHECKPOINT")

    def worker_args(self, concurrency: int, batch: int = 0) -> list[str]:
        return ["--dsn", self.dsn, "--concurrency", str(concurrency), "--batch", str(batch)]

    async def value(self, query: str, *params: Any) -> Any:
        row = await (await self.probe.execute(query, params)).fetchone()
        return row[0] if row else None

    # -- shapes ----------------------------------------------------------------------

    async def defer_workflows(self, n: int) -> None:
        await self.app.tasks[WF3].defer_many([{}] * n)

    async def defer_plain(self, n: int) -> None:
        await self.app.tasks[NOOP].defer_many([{}] * n)

    async def defer_fanout(self, n: int) -> int:
        return int(await self.app.tasks[FANOUT].defer(n))

    async def unfinished(self) -> bool:
        return bool(await self.value(UNFINISHED))

    async def done(self) -> int:
        return int(await self.value("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'"))

    async def steps(self) -> int:
        return int(await self.value("SELECT count(*) FROM asyncq_steps"))

    async def ended(self, job_id: int) -> bool:
        status = await self.value("SELECT status::text FROM asyncq_jobs WHERE id = %s", job_id)
        return status in ("done", "failed", "cancelled")

    async def result(self, job_id: int) -> Any:
        return await self.value("SELECT result FROM asyncq_jobs WHERE id = %s", job_id)

    async def defer_waiter(self, key: str) -> int:
        return int(await self.app.tasks[WAITER].defer(key))

    async def waiting(self, job_id: int) -> bool:
        status = await self.value("SELECT status::text FROM asyncq_jobs WHERE id = %s", job_id)
        return bool(status == "waiting")

    async def emit(self, key: str, sent_at: float) -> None:
        if not await self.app.emit_event(key, sent_at):
            raise RuntimeError(f"the event {key!r} was emitted before")


# -- the worker process ------------------------------------------------------------------


async def serve(args: argparse.Namespace) -> None:
    app = make_app(args.dsn)
    async with app:
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await app.run_worker(concurrency=args.concurrency, batch_size=args.batch or None)
    print("EXIT", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows_asyncq")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=0, help="0: run_worker's own")
    args = parser.parse_args()
    run_async(lambda: serve(args))


if __name__ == "__main__":
    main()
