"""asyncq as it was at the commit given to ``--baseline``: asyncq's own benchmark
(benchmarks/systems/asyncq_system.py) run with ``asyncq_baseline``, that commit's asyncq/
with its imports renamed (benchmarks/baseline.py), on a database of its own.

The harness puts the package's directory on ``sys.path`` before it loads this module;
worker processes get it with ``--path`` (see `System.import_path`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from benchmarks.baseline import PACKAGE
from benchmarks.systems import Ready, WorkerOptions
from benchmarks.systems.asyncq_system import AsyncqSystem, serve


class BaselineSystem(AsyncqSystem):
    name = "baseline"
    title = "asyncq (baseline)"  # the harness names the commit: asyncq@<short sha>
    package = PACKAGE

    def import_path(self) -> str | None:
        return str(Path(str(importlib.import_module(PACKAGE).__file__)).parent.parent)


SYSTEM = BaselineSystem


async def work(options: WorkerOptions, ready: Ready) -> None:
    await serve(PACKAGE, options, ready)
