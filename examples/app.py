"""A small asyncq application to run with the ``asyncq`` command.

From the repository root::

    asyncq migrate examples.app:app       # create the schema
    python -m examples.app defer 10       # queue 10 jobs of each task
    asyncq worker examples.app:app        # run them; Ctrl-C stops it gracefully

The database is ``$ASYNCQ_DSN``, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import asyncq

logger = logging.getLogger(__name__)

app = asyncq.App()


# Explicit names: run as ``python -m examples.app`` this module is ``__main__``, and the
# default name (module.qualname) would differ from the one the worker registers.
@app.task(name="examples.send_email", queue="emails")
async def send_email(order_id: int) -> None:
    """Pretend to email an order confirmation."""
    await asyncio.sleep(0.1)
    logger.info("sent the confirmation for order %d", order_id)


@app.task(name="examples.build_report", max_attempts=5, retry=asyncq.Backoff(base=2, cap=60))
async def build_report(day: str, *, rows: int = 1000) -> None:
    """Pretend to build a report; on its first attempt it fails, to show a retry."""
    job = asyncq.current_job()
    if job.attempt == 1:
        raise ConnectionError("report database unreachable (on purpose, once)")
    await asyncio.sleep(0.2)
    logger.info("built the %s report (%d rows) on attempt %d", day, rows, job.attempt)


async def defer(count: int) -> None:
    async with app:
        emails = await send_email.defer_many([{"order_id": n} for n in range(1, count + 1)])
        reports = [await build_report.defer(f"2024-01-{n:02d}") for n in range(1, count + 1)]
    print(f"deferred {len(emails)} send_email and {len(reports)} build_report jobs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.app")
    commands = parser.add_subparsers(dest="command", required=True)
    defer_parser = commands.add_parser("defer", help="queue jobs for both tasks")
    defer_parser.add_argument("count", type=int, nargs="?", default=10)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(defer(args.count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
