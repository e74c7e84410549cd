"""River (Go, riverqueue/river) beside the Python systems, through its own CLI's benchmark.

River's workers are Go; the harness cannot drive them through benchmarks/worker.py, so River
is measured with its own ``river bench`` on a database of its own on the same server:
``river migrate-up``, then ``river bench --num-total-jobs N``, which inserts N no-op jobs
(``InsertMany``, batches of 5,000), starts one client (the default queue at ``MaxWorkers``
2,000, ``FetchCooldown`` 2 ms, ``FetchPollInterval`` 20 ms, pgxpool at max(4, CPUs)
connections) and works them down; its rate is jobs worked over the time from the client's
start to the last job seen completed (River's own figure).

The binary is optional: ``$ASYNCQ_BENCH_RIVER``, else ``.river/build/river`` (made by
``MIRRORS=... RIVERBUILD=.river/build benchmarks/river/build.sh``, offline from git
mirrors), else ``/tmp/riverbuild/river``. Without one River is skipped with that line.

River's CLI has no command that measures pickup (defer to start, idle worker): the build
adds ``river-pickup`` (benchmarks/river/pickup), a Go program that starts one client with
one queue and a no-op worker and inserts jobs one at a time, each after the last one
started, 10-20 ms apart, as the latency part does for the Python systems; it measures in
its own process from just before ``Insert`` to the first line of ``Work``. Its client
fetches on a notification or every ``FetchPollInterval`` (1 s by default), at most once per
``FetchCooldown`` (100 ms by default), and its inserting client sends that notification at
most once per ``FetchCooldown``: measured at River's defaults and at its bench's tuning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, percentile

HOW_TO_BUILD = (
    "River's CLI not found: build it with `MIRRORS=<git mirrors> RIVERBUILD=.river/build"
    " benchmarks/river/build.sh` (or set $ASYNCQ_BENCH_RIVER)"
)
# The settings `river bench` runs with (cmd/river/riverbench/river_bench.go, v0.43.0).
SETTINGS = {
    "max_workers": 2000,
    "fetch_cooldown_ms": 2,
    "fetch_poll_interval_ms": 20,
    "pool": "pgxpool default: max(4, CPUs) connections",
    "insert": "InsertMany, batches of 5,000, before the client starts",
}
# River's client defaults (river.Config), which `river bench` overrides.
DEFAULTS = {"fetch_cooldown_ms": 100, "fetch_poll_interval_ms": 1000}
# The client settings river-pickup runs at: River's defaults, and its bench's tuning.
PICKUP_SETTINGS = {
    "defaults": {"fetch_cooldown": "100ms", "fetch_poll_interval": "1s"},
    "tuned": {"fetch_cooldown": "2ms", "fetch_poll_interval": "20ms"},
}
SUMMARY = re.compile(
    r"total jobs worked \[\s*(\d+)\s*\], total jobs inserted \[\s*(\d+)\s*\],"
    r" overall job/sec \[\s*([0-9.]+)\s*\], running (\S+)"
)
# river_job rows of finished jobs, as River's completer leaves them (state 'completed').
INSERT_COMPLETED = """
INSERT INTO river_job (args, attempt, attempted_at, created_at, finalized_at, kind,
                       max_attempts, priority, queue, scheduled_at, state)
SELECT '{"num": 0}', 1, t, t, t, 'river_bench_job', 25, 1, 'default', t, 'completed'
  FROM (SELECT now() - interval '1 hour' + g * interval '1 millisecond' AS t
          FROM generate_series(1, %(n)s) AS g) AS s
"""


def binary() -> Path | None:
    """The River CLI to run, or None."""
    candidates = [os.environ.get("ASYNCQ_BENCH_RIVER", "")]
    candidates += [str(ROOT / ".river" / "build" / "river"), "/tmp/riverbuild/river"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def pickup_binary(river: Path) -> Path | None:
    """river-pickup, which build.sh leaves beside River's CLI, or None."""
    path = river.parent / "river-pickup"
    return path if os.access(path, os.X_OK) else None


def pickup_result(lines: list[str]) -> dict[str, Any]:
    """Pickup figures of river-pickup's JSON lines (a settings line, then one per job)."""
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    settings: dict[str, Any] = next((row for row in rows if row.get("settings")), {})
    call = [row["from_call_ms"] for row in rows if "seq" in row]
    commit = [row["from_commit_ms"] for row in rows if "seq" in row]
    if not call:
        raise ValueError("river-pickup printed no samples")
    return {
        "n": len(call),
        "p50_ms": percentile(call, 50),
        "p95_ms": percentile(call, 95),
        "max_ms": max(call),
        "mean_ms": sum(call) / len(call),
        "commit_p50_ms": percentile(commit, 50),
        "commit_p95_ms": percentile(commit, 95),
        "fetch_cooldown_ms": settings.get("fetch_cooldown_ms"),
        "fetch_poll_interval_ms": settings.get("fetch_poll_interval_ms"),
        "samples_ms": [round(v, 3) for v in call],
    }


def go_duration(text: str) -> float:
    """Seconds of a Go duration string (``1.234s``, ``850.2ms``, ``1m2.5s``)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(h|ms|us|µs|ns|m|s)", text)
    if not parts:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(value) * units[unit] for value, unit in parts)


def version_of(path: Path) -> str:
    """River's git ref and commit, from the VERSIONS.txt build.sh leaves beside the binary
    (``river --version`` of a build from local sources says only "(devel)")."""
    with contextlib.suppress(OSError, IndexError):
        for line in (path.parent / "src" / "VERSIONS.txt").read_text().splitlines():
            fields = line.split()
            if fields[0] == "riverqueue/river":
                return f"{fields[2]} ({fields[1]})"
    return "(version unknown)"


def url_of(dsn: str) -> str:
    """The ``postgres://`` URL River's CLI wants, of a libpq DSN (either form)."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.get("user", "")), safe="")
    if parts.get("password"):
        user += ":" + quote(str(parts["password"]), safe="")
    host = str(parts.get("host", "localhost"))
    if host.startswith("/"):  # a socket directory
        where, query = "", f"?host={quote(host, safe='')}&port={parts.get('port', 5432)}"
    else:
        where, query = f"{host}:{parts.get('port', 5432)}", ""
    at = "@" if user else ""
    return f"postgres://{user}{at}{where}/{quote(str(parts.get('dbname', '')))}{query}"


@dataclass
class River:
    """River's CLI bound to River's own database."""

    path: Path
    dsn: str
    log_dir: Path
    version: str = ""
    name: str = "river"

    @property
    def title(self) -> str:
        return f"River {self.version}".strip()

    async def _run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        log: str = "river",
        within: float = 120.0,
    ) -> tuple[int, str]:
        """Run the CLI; after ``within`` seconds SIGTERM it (``river bench`` then stops its
        client and prints its summary), and SIGKILL it 30 s later."""
        return await self._exec(self.path, *args, env=env, log=log, within=within)

    async def _exec(
        self,
        path: Path,
        *args: str,
        env: dict[str, str] | None = None,
        log: str = "river",
        within: float = 120.0,
    ) -> tuple[int, str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{log}.stderr").open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                str(path),
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env={**os.environ, **(env or {})},
            )
            talk = asyncio.ensure_future(proc.communicate())
            done, _ = await asyncio.wait({talk}, timeout=within)
            if not done:
                proc.terminate()
                done, _ = await asyncio.wait({talk}, timeout=30)
                if not done:
                    proc.kill()
            out, _ = await talk
        return proc.returncode or 0, out.decode(errors="replace")

    @property
    def url(self) -> str:
        return url_of(self.dsn)

    async def install(self) -> None:
        self.version = version_of(self.path)
        code, out = await self._run("migrate-up", "--database-url", self.url, log="river-migrate")
        if code != 0:
            raise RuntimeError(f"river migrate-up exited {code}: {out.strip()[-300:]}")

    async def pickup(self, count: int, setting: str) -> dict[str, Any]:
        """River's pickup at a setting of PICKUP_SETTINGS, by river-pickup."""
        path = pickup_binary(self.path)
        if path is None:
            raise FileNotFoundError("river-pickup not found beside River's CLI: " + HOW_TO_BUILD)
        chosen = PICKUP_SETTINGS[setting]
        code, out = await self._exec(
            path,
            "--database-url",
            self.url,
            "--jobs",
            str(count),
            "--fetch-cooldown",
            chosen["fetch_cooldown"],
            "--fetch-poll-interval",
            chosen["fetch_poll_interval"],
            log=f"river-pickup-{setting}",
            within=60 + count * 1.5,
        )
        if code != 0:
            tail = (self.log_dir / f"river-pickup-{setting}.stderr").read_text()[-300:]
            raise RuntimeError(f"river-pickup exited {code}: {tail}")
        return {"setting": setting, **pickup_result(out.splitlines())}

    async def bench(
        self, jobs: int, *, keep_table: bool = False, before_start: str = "", log: str = "river"
    ) -> dict[str, Any]:
        """``river bench --num-total-jobs jobs``; ``keep_table``: leave river_job as the
        harness prepared it (no TRUNCATE, no VACUUM FULL); ``before_start``: statements run
        after the insert, before the client starts (both hooks of benchmarks/river/build.sh;
        stock when off)."""
        env = {}
        if keep_table:
            env["RIVER_BENCH_KEEP_TABLE"] = "1"
        if before_start:
            env["RIVER_BENCH_BEFORE_START"] = before_start
        started = time.perf_counter()
        code, out = await self._run(
            "bench",
            "--database-url",
            self.url,
            "--num-total-jobs",
            str(jobs),
            env=env,
            log=log,
            within=120 + jobs / 100,
        )
        wall = time.perf_counter() - started
        found = SUMMARY.findall(out)
        if code != 0 or not found:
            tail = out.strip()[-300:] or (self.log_dir / f"{log}.stderr").read_text()[-300:]
            raise RuntimeError(f"river bench exited {code} without its summary: {tail}")
        worked, inserted, rate, running = found[-1]
        result = {
            "jobs": jobs,
            "completed": int(worked),
            "inserted": int(inserted),
            "rate": float(rate),
            "seconds": go_duration(running),
            "wall_s": wall,
            "ok": int(worked) == jobs,
            "env": env,
        }
        if not result["ok"]:
            result["error"] = f"river bench worked {worked} of {jobs} jobs"
        return result
