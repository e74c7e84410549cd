"""The ceiling part: asyncq and plain SQL back to back, for the ratios of the targets.

The sweep measures each system's configurations a few minutes apart, and this machine's
speed drifts by more than the targets' margins within minutes: a ratio of two medians
taken that far apart can land anywhere from 0.65x to 0.87x of the same code. Here the
drains that the targets compare run one right after another, in a rotated order, for
``--ceiling-rounds`` rounds:

- asyncq at c=100 b=100, one process and two;
- plain SQL's best configuration (10 coroutines, batches of 100, batched completion);

and each round's ratios (asyncq's one and two processes against plain SQL's one) are
reported with their median. The drains are of ``--ceiling-jobs`` (50,000), over 11
rounds: with five rounds of 20,000 (under half a second each), the median of the same
code's two-process ratio ranged from 0.80x to 1.01x from one run to the next.
Then ``defer_many`` of 1,000 jobs and plain SQL's bulk INSERT of 1,000 (``INSERT ...
SELECT ... FROM jsonb_array_elements``, on a connection of its own to asyncq's database,
its JSON array encoded in each call) take turns in blocks of calls, as the ``defer``
target's plain INSERT does.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.common import connect
from benchmarks.systems import Point, System, time_calls
from benchmarks.systems.sql_system import INSERT_MANY, NOOP

ASYNCQ_ONE = Point(100, 100)
ASYNCQ_TWO = Point(100, 100, processes=2)
SQL_BEST = Point(10, 100, variant="batched")
BULK_BLOCKS = 5
BULK_CALLS = 20  # calls per block


async def run(
    asyncq: System,
    sql: System,
    *,
    rounds: int,
    jobs: int,
    bulk_chunk: int,
    log_dir: Path,
    analyze: bool,
    say: Callable[[str], None],
) -> dict[str, Any]:
    drains = [
        ("asyncq", asyncq, ASYNCQ_ONE),
        ("asyncq x2", asyncq, ASYNCQ_TWO),
        ("sql", sql, SQL_BEST),
    ]
    rows: list[dict[str, float]] = []
    for turn in range(rounds):
        shift = turn % len(drains)
        row: dict[str, float] = {}
        for key, system, point in drains[shift:] + drains[:shift]:
            run = await measure.throughput(system, point, jobs, log_dir, analyze=analyze)
            if not run.get("ok"):
                raise RuntimeError(f"{key} {point.label}: {run.get('error', 'not ok')}")
            row[key] = run["rate"]
            say(f"  ceiling {turn + 1}: {key:9} {point.label:24} {run['rate']:>9,.0f} jobs/s")
        rows.append(row)
    one = [r["asyncq"] / r["sql"] for r in rows]
    two = [r["asyncq x2"] / r["sql"] for r in rows]
    bulk = await bulk_in_turns(asyncq, bulk_chunk)
    say(
        f"  ceiling: one process {statistics.median(one):.2f}x plain SQL,"
        f" two {statistics.median(two):.2f}x;"
        f" defer_many {bulk['defer_many']:,.0f}/s, bulk INSERT {bulk['bulk_insert']:,.0f}/s"
    )
    return {
        "points": {key: point.label for key, _, point in drains},
        "jobs": jobs,
        "rounds": rows,
        "one_vs_sql": one,
        "two_vs_sql": two,
        "one_vs_sql_median": statistics.median(one),
        "two_vs_sql_median": statistics.median(two),
        "bulk": bulk,
    }


async def bulk_in_turns(asyncq: Any, chunk: int) -> dict[str, Any]:
    """``defer_many`` of ``chunk`` jobs and plain SQL's bulk INSERT of as many, in blocks
    of calls taking turns (their order shuffled in each turn); jobs/s of each."""
    conn = await connect(asyncq.dsn)

    async def bulk_insert() -> None:
        # The arguments encoded in each call, as `defer_many` encodes its own (and as
        # plain SQL's bulk enqueue does in the enqueue part).
        args = json.dumps([{}] * chunk)
        await (await conn.execute(INSERT_MANY, (NOOP, args))).fetchall()

    async def defer_many() -> None:
        await asyncq.enqueue_bulk(chunk)

    calls: dict[str, Callable[[], Awaitable[None]]] = {
        "defer_many": defer_many,
        "bulk_insert": bulk_insert,
    }
    spent = dict.fromkeys(calls, 0.0)
    blocks: dict[str, list[float]] = {key: [] for key in calls}
    try:
        await asyncq.reset()
        await measure.settle(asyncq)
        for call in calls.values():
            await time_calls(call, 5)  # warm-up: connections, prepared statements
        started = time.perf_counter()
        for _ in range(BULK_BLOCKS):
            for key in random.sample(list(calls), len(calls)):
                seconds = await time_calls(calls[key], BULK_CALLS)
                spent[key] += seconds
                blocks[key].append(BULK_CALLS * chunk / seconds)
        elapsed = time.perf_counter() - started
    finally:
        await conn.close()
        await asyncq.reset()
    jobs = BULK_BLOCKS * BULK_CALLS * chunk
    result: dict[str, Any] = {key: jobs / seconds for key, seconds in spent.items()}
    result["blocks"] = blocks
    result["ratio"] = result["defer_many"] / result["bulk_insert"]
    result["block_ratios"] = [
        d / b for d, b in zip(blocks["defer_many"], blocks["bulk_insert"], strict=True)
    ]
    result["chunk"] = chunk
    result["seconds"] = elapsed
    return result
