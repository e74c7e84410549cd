"""DBOS Transact in the workflow benchmark (benchmarks/workflows.py): its workflows, the
harness's side (a `DBOSClient`), and the worker process, which launches DBOS
(``python -m benchmarks.workflows_dbos --dsn DSN --concurrency C``).

- ``wf3``: a workflow of three no-op steps (``@DBOS.step()`` functions returning None);
- ``child``: a workflow of no step, the plain jobs and the children alike;
- ``fanout(n)``: enqueues ``n`` children on the queue ``children`` and waits for each
  one's result (``handle.get_result()``), DBOS's fan-out and gather;
- ``waiter()``: ``DBOS.recv("bench")``, then reports the time since the payload (the
  sender's ``time.time()``), first thing.

Queues: ``wf`` (workflows and parents; no limit) and ``children`` (``worker_concurrency``
the worker's ``--concurrency``), polled at DBOS's default interval (1 s). The worker
answers lines on its stdin: ``inline N T`` runs N ``wf3`` called inline from T threads
and prints ``DONE <seconds>``; ``wait ID`` starts ``waiter`` as the workflow ID.
Needs ``pip install dbos``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.common import connect, report_latency

APP = "asyncq-bench"
QUEUE = "wf"
CHILDREN = "children"
TOPIC = "bench"
TABLES = (
    "dbos.workflow_status, dbos.operation_outputs, dbos.notifications, dbos.workflow_events,"
    " dbos.workflow_events_history, dbos.workflow_input, dbos.workflow_output, dbos.streams"
)


def missing() -> str | None:
    """Why DBOS cannot run here, or None."""
    try:
        import dbos  # noqa: F401
    except ImportError:
        return "DBOS is not installed: pip install dbos"
    return None


def url_of(dsn: str) -> str:
    """``dsn`` (a connection string of either form) as the URL DBOS (SQLAlchemy) takes."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.get("user") or ""), safe="")
    password = parts.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(parts.get("host") or "localhost")
    port = parts.get("port") or 5432
    dbname = quote(str(parts.get("dbname") or "postgres"), safe="")
    if host.startswith("/"):  # a socket directory
        return f"postgresql://{auth}/{dbname}?host={quote(host, safe='')}&port={port}"
    return f"postgresql://{auth}{host}:{port}/{dbname}"


def version() -> str:
    from importlib.metadata import version as of

    return of("dbos")


class DbosWorkflows:
    """The harness's side: a DBOSClient to enqueue and send with, and the probes."""

    name = "dbos"
    module = "benchmarks.workflows_dbos"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.client: Any = None
        self.probe: Any = None

    def worker_args(self, concurrency: int) -> list[str]:
        return ["--dsn", url_of(self.dsn), "--concurrency", str(concurrency)]

    async def open(self) -> None:
        """After a worker has launched DBOS once (it makes the schema)."""
        from dbos import DBOSClient

        self.client = await asyncio.to_thread(
            lambda: DBOSClient(system_database_url=url_of(self.dsn), application_name=APP)
        )
        self.probe = await connect(self.dsn)

    async def close(self) -> None:
        if self.client is not None:
            await asyncio.to_thread(self.client.destroy)
        if self.probe is not None:
            await self.probe.close()

    async def reset(self) -> None:
        async with await connect(self.dsn) as conn:
            if await (
                await conn.execute("SELECT to_regclass('dbos.workflow_status')")
            ).fetchone() != (None,):
                await conn.execute(f"TRUNCATE {TABLES}")
            await conn.execute("CHECKPOINT")

    async def value(self, query: str, *params: Any) -> Any:
        row = await (await self.probe.execute(query, params)).fetchone()
        return row[0] if row else None

    async def succeeded(self, name: str) -> int:
        return int(
            await self.value(
                "SELECT count(*) FROM dbos.workflow_status WHERE name = %s AND status = 'SUCCESS'",
                name,
            )
        )

    async def steps(self) -> int:
        return int(
            await self.value(
                "SELECT count(*) FROM dbos.operation_outputs WHERE function_name LIKE %s",
                "%nothing",
            )
        )

    # -- shapes ----------------------------------------------------------------------

    async def enqueue(self, workflow: str, n: int, *args: Any) -> list[Any]:
        """``n`` workflows on their queue, one call each (DBOS has no batch enqueue), from
        8 threads."""
        queue = CHILDREN if workflow == "child" else QUEUE
        options = {"workflow_name": workflow, "queue_name": queue}

        def one(_: int) -> Any:
            return self.client.enqueue(options, *args)

        def all_of() -> list[Any]:
            with ThreadPoolExecutor(8) as pool:
                return list(pool.map(one, range(n)))

        return await asyncio.to_thread(all_of)

    async def waiting(self, workflow_id: str) -> bool:
        """Whether the waiter's recv is set up: its timeout recorded as a durable sleep."""
        found = await self.value(
            "SELECT count(*) FROM dbos.operation_outputs WHERE workflow_uuid = %s"
            " AND function_name = 'DBOS.sleep'",
            workflow_id,
        )
        return bool(found)

    async def send(self, workflow_id: str) -> None:
        def send() -> None:
            self.client.send(workflow_id, time.time(), TOPIC)

        await asyncio.to_thread(send)

    async def result(self, workflow_id: str) -> Any:
        return await self.value(
            "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", workflow_id
        )


# -- the worker process ------------------------------------------------------------------


def serve(args: argparse.Namespace) -> None:
    from dbos import DBOS, SetWorkflowID

    DBOS(
        config={
            "name": APP,
            "system_database_url": args.dsn,
            "log_level": "WARNING",
            "application_version": "bench",
        }
    )

    @DBOS.step(name="nothing")
    def nothing() -> None:
        return None

    @DBOS.workflow(name="wf3")
    def wf3() -> None:
        nothing()
        nothing()
        nothing()

    @DBOS.workflow(name="child")
    def child() -> None:
        return None

    @DBOS.workflow(name="fanout")
    def fanout(n: int) -> int:
        handles = [DBOS.enqueue_workflow(CHILDREN, child) for _ in range(n)]
        return len([handle.get_result() for handle in handles])

    @DBOS.workflow(name="waiter")
    def waiter() -> None:
        sent_at = DBOS.recv(TOPIC, timeout_seconds=60)
        report_latency(sent_at)

    DBOS.launch()
    DBOS.register_queue(QUEUE, on_conflict="always_update")
    DBOS.register_queue(CHILDREN, worker_concurrency=args.concurrency, on_conflict="always_update")
    print("READY", flush=True)
    sys.stdin.readline()
    try:
        for line in sys.stdin:
            command, *rest = line.split()
            if command == "inline":
                n, threads = int(rest[0]), int(rest[1])
                started = time.perf_counter()
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda _: wf3(), range(n)))
                print(f"DONE {time.perf_counter() - started:.6f}", flush=True)
            elif command == "wait":
                with SetWorkflowID(rest[0]):
                    DBOS.start_workflow(waiter)
    finally:
        DBOS.destroy()
        print("EXIT", flush=True)
        os._exit(0)  # DBOS's threads would hold the process


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows_dbos")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
