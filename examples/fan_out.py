"""Fan-out and fan-in: summarise a long document with one child job per section.

From the repository root::

    python examples/fan_out.py

The parent job splits a document into 100 sections (a step), spawns one child job per
section (``ctx.spawn_many``), waits for all of them (``ctx.gather``: the parent is
suspended meanwhile, and holds no worker slot), then summarises their answers (a step).
Each child asks a language model, here a stand-in that is slow and rate-limited one call
in five: a rate-limited child fails its attempt and is retried with backoff, on its own,
while the others go on. It prints what the children and the parent did, read back from
the ``asyncq_jobs`` table. The database is ``$ASYNCQ_DSN`` when it is set, else the
embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import sys
from collections import Counter
from typing import Any

import asyncq

QUEUE = "fan-out"
SECTIONS = 100
TIMEOUT = 60.0
TOPICS = ("revenue", "costs", "hiring", "risks", "outlook")

app = asyncq.App()
calls: Counter[str] = Counter()  # in this process: how many times each function ran


class RateLimited(Exception):
    """The model's API said 429 Too Many Requests."""


async def llm(prompt: str) -> str:
    """Stands for a language model behind an API: slow, rate-limited one call in five, and
    it answers with what the prompt is about."""
    calls["llm"] += 1
    await asyncio.sleep(random.uniform(0.01, 0.05))
    if random.random() < 0.2:
        calls["rate limited"] += 1
        raise RateLimited("429 Too Many Requests")
    (top, count), *rest = Counter(re.findall(r"about (\w+)", prompt, re.I)).most_common()
    if not rest:
        return f"About {top}."
    others = ", ".join(f"{topic} ({n})" for topic, n in rest)
    return f"Mostly about {top} ({count} sections), then {others}."


def split(title: str, sections: int) -> list[str]:
    """Stands for reading a long document and cutting it into sections."""
    calls["split"] += 1
    rng = random.Random(title)
    return [
        f"Section {n + 1} of {title}. It is about {rng.choice(TOPICS)}. " + "Lorem ipsum. " * 50
        for n in range(sections)
    ]


@app.task(
    queue=QUEUE,
    name="fan_out.summarise_section",
    max_attempts=10,
    retry=asyncq.Backoff(base=0.05, cap=0.5),
    retry_on=(RateLimited,),
)
async def summarise_section(text: str) -> str:
    # A step: once answered, the call is not made (nor paid for) again if the job runs
    # again, as it would after its worker stopped or crashed.
    return await asyncq.current_job().step("llm", llm, f"Summarise: {text}")


@app.task(
    queue=QUEUE,
    name="fan_out.summarise_document",
    max_attempts=10,
    retry=asyncq.Backoff(base=0.05, cap=0.5),
    retry_on=(RateLimited,),
)
async def summarise_document(title: str, sections: int) -> dict[str, Any]:
    ctx = asyncq.current_job()
    texts = await ctx.step("split", split, title, sections)
    ids = await ctx.spawn_many(summarise_section, [{"text": text} for text in texts])
    # Suspends this job until every child has ended; a child that used up its attempts
    # stands in the list as an asyncq.ChildFailed, and its section is left out.
    answers = await ctx.gather(ids, return_exceptions=True)
    answered = [answer for answer in answers if isinstance(answer, str)]
    summary = await ctx.step("summarise", llm, "Summarise: " + " ".join(answered))
    return {"sections": len(ids), "answered": len(answered), "summary": summary}


async def main() -> int:
    title = "the annual report"
    async with app:
        await app.migrate()
        parent = await summarise_document.defer(title, SECTIONS)
        worker = asyncio.create_task(
            app.run_worker(queues=[QUEUE], concurrency=20, handle_signals=False)
        )
        try:
            result = await app.result(parent, timeout=TIMEOUT)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        async with app.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'done'), sum(attempts),"
                " max(attempts) FROM asyncq_jobs WHERE parent_id = %s",
                (parent,),
            )
            children, done, attempts, most = await cursor.fetchone() or (0, 0, 0, 0)
            cursor = await conn.execute(
                "SELECT claims, attempts FROM asyncq_jobs WHERE id = %s", (parent,)
            )
            claims, parent_attempts = await cursor.fetchone() or (0, 0)
            cursor = await conn.execute(
                "SELECT string_agg(name || '@' || attempt, ' ' ORDER BY position)"
                " FROM asyncq_steps WHERE job_id = %s",
                (parent,),
            )
            steps = (await cursor.fetchone() or ("",))[0]

    print(f"{title}: {SECTIONS} sections, one child job each")
    print(
        f"  children:  {children} spawned, {done} done, in {attempts} attempts"
        f" ({attempts - children} retries; at most {most} attempts for one section)"
    )
    print(f"  llm calls: {calls['llm']}, of which {calls['rate limited']} rate-limited")
    print(
        f"  parent:    job {parent}, {parent_attempts} attempt(s) in {claims} runs"
        " (suspended while its children ran)"
    )
    print(f"  its steps: {steps}; split() ran {calls['split']} time(s)")
    print(f"  answered:  {result['answered']} of {result['sections']} sections")
    print(f"  summary:   {result['summary']}")
    ok = done == children == SECTIONS and result["answered"] == SECTIONS
    print("every section summarised" if ok else "some sections were not summarised")
    return 0 if ok else 1


if __name__ == "__main__":
    # A rate-limited call is expected here: the retries are counted above, not logged.
    logging.getLogger("asyncq.worker").setLevel(logging.ERROR)
    sys.exit(asyncio.run(main()))
