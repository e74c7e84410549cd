"""Cancel jobs that run in another process, and pause a queue.

From the repository root::

    python examples/cancel.py

It starts a worker process (``asyncq worker examples.cancel:app``), defers three jobs,
and cancels them: one that has finished (nothing to do), one that runs in the worker
process (aborted there: its ``finally`` block runs and the row ends ``cancelled``), and
one that waits in the queue (cancelled at once). Then it pauses the queue, defers a
job that waits until the queue is resumed, and prints what the rows say. The database
is ``$ASYNCQ_DSN`` when it is set, else the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import asyncq

QUEUE = "exports"
ROOT = Path(__file__).resolve().parents[1]

app = asyncq.App()


@app.task(queue=QUEUE, name="cancel.export_report")
async def export_report(month: str, seconds: float) -> str:
    try:
        await asyncio.sleep(seconds)  # stands for a long export
        return f"report for {month}"
    finally:
        print(f"export of {month}: cleaning up", file=sys.stderr, flush=True)


async def status(job_id: int) -> str:
    async with app.pool.connection() as conn:
        row = await (
            await conn.execute("SELECT status FROM asyncq_jobs WHERE id = %s", (job_id,))
        ).fetchone()
    return str(row[0]) if row else "?"


async def wait_for(job_id: int, wanted: str) -> None:
    async with asyncio.timeout(30):
        while await status(job_id) != wanted:  # noqa: ASYNC110 - another process writes it
            await asyncio.sleep(0.02)


async def main() -> int:
    async with app:
        await app.migrate()
        env = {**os.environ, "ASYNCQ_DSN": app.dsn, "PYTHONPATH": str(ROOT)}
        worker = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "asyncq", "worker", "examples.cancel:app", "-q", QUEUE],
            env=env,
            cwd=ROOT,
        )
        try:
            finished = await export_report.defer("2026-09", seconds=0)
            await wait_for(finished, "done")
            running = await export_report.defer("2026-10", seconds=3600)
            await wait_for(running, "running")
            waiting = await export_report.options(delay=3600).defer("2026-11", seconds=0)

            asked = time.monotonic()
            answers = await app.cancel(finished, running, waiting)
            print(f"cancel answered: {answers}")
            await wait_for(running, "cancelled")
            print(
                f"the running job was cancelled in its worker {time.monotonic() - asked:.3f}s later"
            )

            await app.pause(QUEUE)
            held = await export_report.defer("2026-12", seconds=0)
            await asyncio.sleep(1.5)
            print(f"while {QUEUE} is paused, job {held} is {await status(held)}")
            await app.resume(QUEUE)
            await wait_for(held, "done")
            print(f"resumed: job {held} is {await status(held)}")

            async with app.pool.connection() as conn:
                cursor = await conn.execute(
                    "SELECT id, status, attempts, last_error FROM asyncq_jobs"
                    " WHERE id = ANY(%s) ORDER BY id",
                    ([finished, running, waiting, held],),
                )
                found = await cursor.fetchall()
        finally:
            worker.terminate()
            await worker.wait()

    print(f"{'job':>4}  {'status':<10} attempts  last_error")
    for job_id, job_status, attempts, last_error in found:
        print(f"{job_id:>4}  {job_status:<10} {attempts:>8}  {last_error or '-'}")
    ok = [row[1] for row in found] == ["done", "cancelled", "cancelled", "done"]
    print("every job ended as asked" if ok else "unexpected statuses")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
