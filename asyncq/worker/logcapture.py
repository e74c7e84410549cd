"""What tasks log while their attempts run, kept with each attempt (``--log-capture``).

The worker wraps the logging module's record factory while it runs (`LogCapture.install`),
not its handlers: every record is made by the factory the application had, and goes to its
handlers as before; a handler added to the root logger would have changed what they print
(``logging.basicConfig`` does nothing once the root logger has a handler, and Python's
last resort prints nothing then either). asyncq sets no logger's level: a record that the
loggers' levels drop (below WARNING, where nothing configures logging) is not made, so not
kept either; one that is made is kept whether a handler prints it or not.

A record is kept when it is at the capture level or above, and made in the context of an
attempt this worker runs (the task's own code, in its event loop task or in the thread of
a plain ``def`` task): the factory finds the attempt in `asyncq.job`'s context variable.
Per attempt, at most `MAX_RECORDS` records and `MAX_BYTES` of their text: the first `FIRST`
records (within half of those bytes), then the latest that fit, with a count of those
dropped between them; each message (and traceback) at most `MAX_MESSAGE` characters. The
runner takes an attempt's records when it ends (`take`): an attempt that logs nothing costs
nothing.
"""

from __future__ import annotations

import collections
import logging
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from asyncq import codec
from asyncq.job import Job, JobContext, running_job

MAX_RECORDS = 50
MAX_BYTES = 16 * 1024
FIRST = 10
MAX_MESSAGE = 2000

Key = tuple[int, int]  # a job's id and the claim its attempt holds it by


def _clean(text: str, limit: int) -> str:
    """``text`` as PostgreSQL can store it in JSON (no NUL, no lone surrogate), cut to
    ``limit`` characters."""
    if len(text) > limit:
        text = text[: limit - 14] + " ... (trimmed)"
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class AttemptLog:
    """The records one attempt logged: the first `FIRST`, then the latest within the
    bounds."""

    __slots__ = ("dropped", "first", "last", "size")

    def __init__(self) -> None:
        self.first: list[dict[str, Any]] = []
        self.last: collections.deque[tuple[dict[str, Any], int]] = collections.deque()
        self.size = 0
        self.dropped = 0

    def add(self, entry: dict[str, Any]) -> None:
        size = sum(
            len(v) if v.isascii() else len(v.encode("utf-8"))
            for v in entry.values()
            if isinstance(v, str)
        )
        if not self.last and len(self.first) < FIRST and self.size + size <= MAX_BYTES // 2:
            self.first.append(entry)
            self.size += size
            return
        last = self.last
        last.append((entry, size))
        self.size += size
        while last and (self.size > MAX_BYTES or len(self.first) + len(last) > MAX_RECORDS):
            _, gone = last.popleft()
            self.size -= gone
            self.dropped += 1

    def json(self) -> str:
        records = [*self.first, *(entry for entry, _ in self.last)]
        return codec.to_json({"records": records, "dropped": self.dropped})


class LogCapture:
    """Keeps the records of this worker's running attempts in `logs`, by the job's id and
    claim, until the runner takes them."""

    def __init__(self, *, worker: str, level: int, running: Callable[[Job], bool]) -> None:
        self.worker = worker
        self.level = level
        self.running = running  # whether an attempt of this claim runs here now
        self.logs: dict[Key, AttemptLog] = {}
        self._previous: Callable[..., logging.LogRecord] | None = None
        self._factory: Callable[..., logging.LogRecord] | None = None
        self._on = False

    def install(self) -> None:
        previous = self._previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if self._on and record.levelno >= self.level:
                job = self._attempt()
                if job is not None:
                    self._keep(job, record)
            return record

        self._factory = factory
        self._on = True
        logging.setLogRecordFactory(factory)

    def remove(self) -> None:
        self._on = False
        if self._factory is not None and logging.getLogRecordFactory() is self._factory:
            assert self._previous is not None
            logging.setLogRecordFactory(self._previous)
        # Else another factory wraps this one since: it stays, and passes records through.
        self.logs.clear()

    def take(self, job: Job) -> str | None:
        """The records of ``job``'s attempt as JSON, forgotten here (None: it logged none)."""
        found = self.logs.pop((job.id, job.claim), None)
        return None if found is None else found.json()

    def _attempt(self) -> Job | None:
        found = running_job.get(None)
        if found is None:
            return None
        if isinstance(found, JobContext):
            if found.worker != self.worker or found.workflow is None:
                return None
            job = found.workflow.job
        else:
            job, worker = found[0], found[1]
            if worker != self.worker:
                return None
        return job if self.running(job) else None

    def _keep(self, job: Job, record: logging.LogRecord) -> None:
        # No lock: each attempt's records go to its own list (a plain def task's from its
        # one thread), and a dict's setdefault and pop are atomic.
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not fail the task
            message = f"{record.msg!r} % {record.args!r}"
        entry: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": _clean(message, MAX_MESSAGE),
        }
        if record.exc_info and record.exc_info[0] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            entry["exception"] = _clean(text, MAX_MESSAGE)
        key = (job.id, job.claim)
        log = self.logs.get(key)
        if log is None:
            log = self.logs.setdefault(key, AttemptLog())
        log.add(entry)


def level_of(name: str) -> int | None:
    """The level of ``--log-capture`` (None: off)."""
    return None if name == "off" else logging.getLevelName(name)
