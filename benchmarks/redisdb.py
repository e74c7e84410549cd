"""The Redis of arq and of the shape benchmark's bare list loop.

Both use one Redis database number of their own (15 unless ``--redis`` or
``$ASYNCQ_BENCH_REDIS`` names another) and delete only their own keys, by pattern
(``arq:*``, ``bench:*``): never FLUSHDB or FLUSHALL, which would take other data with it.

Redis keeps its data in memory; whether a job survives a restart depends on the server's
``save`` and ``appendonly`` settings, which `facts` reads and the report prints. The
Redis this machine starts has both off: a job is gone with a restart, where a job of
every PostgreSQL system here is in the WAL once its INSERT commits.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

DEFAULT_URL = "redis://127.0.0.1:6379/15"


def resolve(url: str | None = None) -> str:
    return url or os.environ.get("ASYNCQ_BENCH_REDIS") or DEFAULT_URL


def describe(url: str) -> str:
    parts = urlparse(url)
    return f"redis://{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path or '/0'}"


def client(url: str, **kwargs: Any) -> Any:
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url, **kwargs)


async def clear(url: str, *patterns: str) -> int:
    """Delete the keys matching ``patterns`` in ``url``'s database; returns how many."""
    deleted = 0
    async with client(url) as r:
        for pattern in patterns:
            batch: list[bytes] = []
            async for key in r.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += await r.unlink(*batch)
                    batch = []
            if batch:
                deleted += await r.unlink(*batch)
    return deleted


async def facts(url: str) -> dict[str, str]:
    """The server's version and its persistence settings (what a restart keeps)."""
    async with client(url) as r:
        info = await r.info("server")
        persistence = await r.info("persistence")
        out = {"redis_version": str(info.get("redis_version", "?"))}
        for name in ("save", "appendonly", "appendfsync"):
            value = await r.config_get(name)
            out[name] = str(value.get(name, "?"))
        out["aof_enabled"] = str(persistence.get("aof_enabled", "?"))
    return out


def durability(facts: dict[str, str]) -> str:
    """One line on what a Redis restart keeps, from `facts`."""
    save = facts.get("save", "?")
    aof = facts.get("appendonly", "?")
    if save in ("", "''") and aof == "no":
        return (
            "Redis with persistence off (save '', appendonly no): its queue lives in memory"
            " only and a restart loses every job; the PostgreSQL systems' jobs are in the WAL"
            " once their INSERT commits"
        )
    return (
        f"Redis with save {save!r}, appendonly {aof} (appendfsync"
        f" {facts.get('appendfsync', '?')}): jobs written since the last snapshot or fsync"
        " are lost with a crash; the PostgreSQL systems' jobs are in the WAL once their"
        " INSERT commits"
    )
