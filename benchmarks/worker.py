"""One worker process: ``python -m benchmarks.worker SYSTEM --dsn DSN --mode drain|serve ...``.

It connects, prints ``READY``, waits for a line on stdin (so that the clock starts
when every worker of a run is connected), runs the system's worker, prints ``EXIT``.
``--path DIR`` adds DIR to sys.path before the system is loaded (the baseline's package).
``--mode client`` runs the system's ``client(options)`` instead, for a system whose
enqueues run in a process of their own (oban: see benchmarks/systems/oban_system.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from benchmarks.common import run_async
from benchmarks.systems import MODULES, WorkerOptions, load


async def _ready() -> None:
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("system", choices=sorted(MODULES))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--mode", choices=["drain", "serve", "client"], default="drain")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--variant", default="")
    parser.add_argument("--path", action="append", default=[], help="a directory for sys.path")
    args = parser.parse_args()
    sys.path.extend(args.path)
    options = WorkerOptions(
        dsn=args.dsn,
        mode=args.mode,
        concurrency=args.concurrency,
        batch=args.batch,
        variant=args.variant,
    )
    module = load(args.system)
    if args.mode == "client":
        run_async(lambda: module.client(options))
        return

    async def run() -> None:
        await module.work(options, _ready)
        print("EXIT", flush=True)

    run_async(run)


if __name__ == "__main__":
    main()
