"""The log capture only copies: in a process whose logging nobody configured, what a task
logs is printed as Python prints it (its last resort, to stderr) and kept with the
attempt; a ``logging.basicConfig`` made while the worker runs configures logging as it
would without asyncq."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

from tests.harness.processes import REPO

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, logging, sys

    import asyncq

    app = asyncq.App(sys.argv[1])
    log = logging.getLogger("shop")

    @app.task(name="capture.warns")
    async def warns(configure: bool) -> None:
        if configure:
            logging.basicConfig(format="configured: %(message)s", level=logging.INFO)
        log.info("an info line")
        log.warning("a warning line")

    async def main() -> None:
        async with app:
            first = await warns.defer(configure=False)
            await app.run_worker(drain=True, handle_signals=False)
            second = await warns.defer(configure=True)
            await app.run_worker(drain=True, handle_signals=False)
            async with app.pool.connection() as conn:
                for job_id in (first, second):
                    cur = await conn.execute(
                        "SELECT logs FROM asyncq_jobs WHERE id = %s", (job_id,)
                    )
                    [(logs,)] = await cur.fetchall()
                    print(json.dumps([r["message"] for r in logs["records"]]))

    asyncio.run(main())
    """
)


def test_capturing_changes_nothing_the_application_prints(dsn: str, db: Any) -> None:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, dsn],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    err = run.stderr.splitlines()
    # Nothing configured logging: the last resort prints warnings (not the info line).
    assert err[0] == "a warning line", run.stderr
    # The task's basicConfig took effect: the root logger had no handler of asyncq's.
    assert "configured: an info line" in err and "configured: a warning line" in err
    first, second = run.stdout.splitlines()
    # Kept: what the loggers' levels let through (WARNING, where nothing set a level;
    # INFO once basicConfig set it).
    assert first == '["a warning line"]'
    assert second == '["an info line", "a warning line"]'
