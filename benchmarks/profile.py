"""``--profile``: one asyncq drain under py-spy; the functions that cost the most.

py-spy samples the worker process from outside (``--nonblocking``, so the worker is
never paused) and writes collapsed stacks; this module ranks functions by the share
of samples in which they are running (self) or on the stack (total).
"""

from __future__ import annotations

import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.systems import Point, System

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _name(frame: str) -> str:
    match = FRAME.match(frame)
    if not match:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "/work/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{match['func']} ({path})"


RATE = 250
STARTUP = "<frozen importlib"  # samples of start-up imports are left out
# Frames on (nearly) every stack, which say nothing in the "total" ranking.
PLUMBING = (
    "_run_module_as_main ",
    "_run_code ",
    "<module> (benchmarks/",
    "main (benchmarks/",
    "main.<locals>.run (benchmarks/",
    "run_async (benchmarks/",
    "run (uvloop/",
    "run.<locals>.wrapper (uvloop/",
    "Runner.run (asyncio/",
    "work (benchmarks/",
)


def rank(raw: Path, top: int = 15) -> dict[str, Any]:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_name(f) for f in stack.split(";") if f]
        if not frames or any(STARTUP in f for f in frames):
            continue
        samples += count
        own[frames[-1]] += count
        for name in set(frames):
            if not name.startswith(PLUMBING):
                total[name] += count

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": k, "share": v / samples} for k, v in counter.most_common(top)]

    return {"samples": samples, "self": share(own), "total": share(total)}


async def run(
    system: System, point: Point, jobs: int, out_dir: Path, log_dir: Path
) -> dict[str, Any]:
    spy = py_spy()
    if spy is None:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    raw = out_dir / "asyncq-profile.txt"
    wrapper = (spy, "record", "--nonblocking", "--rate", str(RATE), "--format", "raw")
    wrapper += ("-o", str(raw), "--")
    drain = await measure.throughput(system, point, jobs, log_dir, wrapper)
    result = rank(raw)
    result.update(
        {
            "point": point.label,
            "jobs": jobs,
            "rate_under_profiler": drain["rate"],
            # py-spy drops the samples of an idle thread (waiting in the event loop's poll):
            # this is the share of the drain during which the worker ran Python code.
            "busy_share": result["samples"] / (drain["seconds"] * RATE),
            "raw": str(raw),
        }
    )
    return result


def render(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"profile: {result['error']}"
    lines = [
        f"profile of an asyncq drain ({result['jobs']:,} jobs, {result['point']},"
        f" {result['rate_under_profiler']:,.0f} jobs/s under py-spy): {result['samples']:,}"
        f" samples in the worker, busy {result['busy_share']:.0%} of the drain",
        "  most samples running (self):",
    ]
    lines += [f"    {row['share']:6.1%}  {row['function']}" for row in result["self"]]
    lines.append("  most samples on the stack (total):")
    lines += [f"    {row['share']:6.1%}  {row['function']}" for row in result["total"]]
    return "\n".join(lines)
