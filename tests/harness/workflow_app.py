"""Work that spans jobs, for the harness's worker processes
(``tests.harness.workflow_app:app``): an order that runs steps, fans out to children
and gathers them, then waits for an event; a nap (a durable sleep); a batch, parts and
a callback after them. The children and the parts wait for an event of their own, so
that a test sees every job wait before it lets them go on (`release`).

Each step appends its name to the ledger (`tests.harness.ledger`) when it runs, so a
test counts the steps that ran again. The environment sets the App up as for
`tests.harness.app`: ``$ASYNCQ_DSN``, ``$HARNESS_SCHEMA``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio

import asyncq
from asyncq import current_job
from tests.harness.ledger import record

app = asyncq.App(schema=os.environ.get("HARNESS_SCHEMA") or None)

APP = "tests.harness.workflow_app:app"


def released(order: int) -> str:
    """The event that lets an order's children (or a batch's parts) end."""
    return f"order-{order}.released"


def shipped(order: int) -> str:
    """The event an order waits for after its children."""
    return f"order-{order}.shipped"


def _ran(name: str, value: Any) -> Any:
    record(name)
    return value


@app.task(name="flow.item")
async def item(order: int, n: int) -> int:
    """A child or a part: waits until its order is released, then returns ``n * n``."""
    await current_job().wait_for_event(released(order))
    return n * n


@app.task(name="flow.order", max_attempts=1)
async def order(order: int, items: int) -> dict[str, Any]:
    ctx = current_job()
    charged = await ctx.step("charge", _ran, "charge", {"order": order})
    ids = await ctx.spawn_many(item, [{"order": order, "n": n} for n in range(items)])
    squares = await ctx.gather(ids)
    packed = await ctx.step("pack", _ran, "pack", sum(squares))
    note = await ctx.wait_for_event(shipped(order), timeout=3600)
    await ctx.step("notify", _ran, "notify", note)
    return {"charged": charged, "packed": packed, "note": note}


@app.task(name="flow.nap")
async def nap(seconds: float) -> str:
    await current_job().sleep(seconds)
    return "woke"


@app.task(name="flow.callback")
async def callback(parts: list[int]) -> int:
    return len(parts)


@app.task(name="flow.batch")
async def batch(order: int, parts: int) -> int:
    """Defers ``parts`` parts and a callback after them (run whatever they end as); the
    callback's id."""
    ids = [await item.defer(order, n) for n in range(parts)]
    return await callback.options(after=ids, on_parent_failure="run").defer(ids)


async def _emit(dsn: str, key: str, payload: Any) -> bool:
    async with asyncq.App(dsn) as emitter:
        return await emitter.emit_event(key, payload)


def emit(dsn: str, key: str, payload: Any = None) -> bool:
    """``app.emit_event`` from a test's own process, in a thread of its own (the test's
    may run an event loop already: playwright's)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(anyio.run, _emit, dsn, key, payload).result()
