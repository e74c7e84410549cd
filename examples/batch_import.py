"""A batch with a callback: import many files, then report once, however they ended.

From the repository root::

    python examples/batch_import.py

It defers 12 import jobs in one ``defer_many``, then one report job ``after`` all of them
with ``on_parent_failure="run"``: it waits (status ``waiting``, never claimed) until
every import has ended, done or failed, then runs and reads each import's outcome with
``app.result``. Two files are broken on purpose (their imports fail at once), and one
import fails its first attempt on a dropped connection and succeeds on its retry: the
report waits for that retry too. A publish job ``after`` the same imports, with the
default ``on_parent_failure="cancel"``, is cancelled instead, since two of them failed.
The database is ``$ASYNCQ_DSN`` when it is set, else the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
from typing import Any

import asyncq

QUEUE = "imports"
TIMEOUT = 60.0
BROKEN = {"customers-04.csv", "customers-09.csv"}
FLAKY = "customers-07.csv"

app = asyncq.App()


@app.task(
    queue=QUEUE,
    name="batch_import.import_file",
    max_attempts=3,
    retry=asyncq.Backoff(base=0.2, cap=0.5),
    retry_on=(ConnectionError,),  # a broken file fails at once: a retry would not mend it
)
async def import_file(path: str) -> dict[str, Any]:
    """Stands for loading a CSV file into a table."""
    await asyncio.sleep(random.uniform(0.01, 0.1))
    if path in BROKEN:
        raise ValueError(f"{path}: line 3 has 2 fields, the header 5")
    if path == FLAKY and asyncq.current_job().attempt == 1:
        raise ConnectionError("the connection to the warehouse dropped")
    return {"path": path, "rows": 1000 + 37 * int(path[10:12])}


@app.task(queue=QUEUE, name="batch_import.report")
async def report(batch: str, imports: list[int]) -> dict[str, Any]:
    """The batch's callback: it runs once every import has ended, done or not."""
    loaded: list[dict[str, Any]] = []
    failed: list[str] = []
    for job_id in imports:
        try:  # each import has ended: its outcome is there, no wait
            loaded.append(await app.result(job_id, timeout=0))
        except (asyncq.JobFailed, asyncq.JobCancelled) as exc:
            failed.append((exc.last_error or "").splitlines()[0])
    return {
        "batch": batch,
        "files": len(loaded),
        "rows": sum(result["rows"] for result in loaded),
        "failed": failed,
    }


@app.task(queue=QUEUE, name="batch_import.publish")
async def publish(batch: str) -> None:
    """Runs only if every import is done (the default, on_parent_failure="cancel")."""


async def statuses(ids: list[int]) -> dict[int, tuple[str, str | None]]:
    async with app.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT id, status, waiting_for FROM asyncq_jobs WHERE id = ANY(%s)", (ids,)
        )
        return {
            job_id: (status, waiting_for) for job_id, status, waiting_for in await cursor.fetchall()
        }


async def main() -> int:
    batch = "2026-11-30"
    files = [f"customers-{n:02d}.csv" for n in range(1, 13)]
    async with app:
        await app.migrate()
        imports = await import_file.defer_many([{"path": path} for path in files])
        report_id = await report.options(after=imports, on_parent_failure="run").defer(
            batch, imports
        )
        publish_id = await publish.options(after=imports).defer(batch)
        before = await statuses([report_id, publish_id])
        print(f"deferred {len(imports)} imports (jobs {imports[0]}..{imports[-1]})")
        for name, job_id in (("report", report_id), ("publish", publish_id)):
            status, waiting_for = before[job_id]
            print(f"{name} job {job_id}: {status} (waiting_for: {waiting_for})")

        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=4, handle_signals=False)
        )
        try:
            outcome = await app.result(report_id, timeout=TIMEOUT)
            try:
                await app.result(publish_id, timeout=TIMEOUT)
                published = "done"
            except asyncq.JobCancelled as exc:
                published = f"cancelled ({exc.last_error})"
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        ended = await statuses(imports)

    done = sum(1 for status, _ in ended.values() if status == "done")
    print()
    print(f"imports: {done} done, {len(imports) - done} failed")
    print(f"report of batch {outcome['batch']} (job {report_id}):")
    print(f"  loaded: {outcome['files']} files, {outcome['rows']} rows")
    print(f"  failed: {len(outcome['failed'])} files")
    for error in outcome["failed"]:
        print(f"    {error}")
    print(f"publish (job {publish_id}): {published}")
    ok = outcome["files"] == 10 and len(outcome["failed"]) == 2
    print("the report saw every import end" if ok else "the report saw something else")
    return 0 if ok else 1


if __name__ == "__main__":
    # The worker logs the retried and failed imports (WARNINGs), here among the prints.
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    sys.exit(asyncio.run(main()))
