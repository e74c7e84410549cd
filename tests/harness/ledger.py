"""The ledger: every execution of a task appends a line to one file, outside the
database, so a test can count executions independently of what the jobs table says.

A line is ``<event> <job id> <attempt> <pid> <unix time>``, written by one ``write`` to
the file opened with ``O_APPEND``: lines from many processes never mix, their order in
the file is the order of the writes, and a line once written survives a ``kill -9`` of
its process (the page cache outlives it; the machine itself does not crash in these
tests). The file is named by ``$HARNESS_LEDGER``.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import asyncq

ENV = "HARNESS_LEDGER"

_open: tuple[int, str, int] | None = None  # (pid, path, fd) of this process's ledger


def record(event: str) -> None:
    """Append ``event`` for the running job (called by the harness app's tasks)."""
    global _open
    pid, path = os.getpid(), os.environ[ENV]
    if _open is None or _open[:2] != (pid, path):
        _open = (pid, path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    job = asyncq.current_job()
    os.write(_open[2], f"{event} {job.id} {job.attempt} {pid} {time.time():.6f}\n".encode())


@dataclass(frozen=True)
class Entry:
    """One ledger line; ``index`` is its position in the file (the order of the writes)."""

    index: int
    event: str
    job_id: int
    attempt: int
    pid: int
    at: float


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def entries(self) -> list[Entry]:
        found = []
        for index, line in enumerate(self.path.read_text().splitlines()):
            event, job_id, attempt, pid, at = line.split()
            found.append(Entry(index, event, int(job_id), int(attempt), int(pid), float(at)))
        return found

    def events(self, event: str, job_id: int | None = None) -> list[Entry]:
        return [
            e for e in self.entries() if e.event == event and (job_id is None or e.job_id == job_id)
        ]

    def by_job(self) -> dict[int, list[Entry]]:
        found: dict[int, list[Entry]] = defaultdict(list)
        for entry in self.entries():
            found[entry.job_id].append(entry)
        return found

    def mark(self, event: str) -> Entry:
        """Append a line of the test's own (job 0), to order it against the workers' lines."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, f"{event} 0 0 {os.getpid()} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)
        return self.events(event)[-1]

    def first_start(self, job_id: int, attempt: int | None = None) -> Entry | None:
        for entry in self.events("start", job_id):
            if attempt is None or entry.attempt == attempt:
                return entry
        return None
