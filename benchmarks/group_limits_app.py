"""The App of the group limits benchmark (``benchmarks.group_limits_app:app``).

``group_concurrency`` is one number per task (it bounds every group of the task alike), so
the three limits are three tasks, each deferred in a group of its own: ``A`` at 25, ``B``
at 5, ``C`` at 1. ``tenant`` has no limit; its jobs are deferred in groups for the first
job behind a backlog. Every job sleeps ``ms`` milliseconds."""

from __future__ import annotations

import asyncio

import asyncq

LIMITS = {"A": 25, "B": 5, "C": 1}
TENANT = "groups.tenant"


def task_name(group: str) -> str:
    return f"groups.limited_{group}"


def register(app: asyncq.App) -> dict[str, asyncq.Task[..., None]]:
    """The tasks on ``app``: one per group of LIMITS, by group, and TENANT."""

    async def work(ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    tasks = {
        group: app.task(name=task_name(group), group_concurrency=limit)(work)
        for group, limit in LIMITS.items()
    }
    tasks[TENANT] = app.task(name=TENANT)(work)
    return tasks


app = asyncq.App()
register(app)
