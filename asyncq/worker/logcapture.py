"""What tasks log while their attempts run, kept with each attempt (``--log-capture``).

The worker adds one handler to the root logger while it runs. It only copies: what the
other handlers print is left as it was, and asyncq sets no logger's level. So it sees a
record only if the application's logging lets it reach the root logger: a record below
its logger's level (below WARNING, where nothing configures logging) is neither printed
nor kept, and neither is one of a logger that does not propagate. When the root logger
has no handler but this one, the records Python would have printed to stderr for want of
a handler (``logging.lastResort``) are still printed.

A record is kept when it is at the capture level or above, and emitted in the context of
an attempt this worker runs (the task's own code, in its event loop task or in the
thread of a plain ``def`` task): the handler finds the attempt in `asyncq.job`'s context
variable. Per attempt, at most `MAX_RECORDS` records and `MAX_BYTES` of their text: the
first `FIRST` records, then the latest that fit, with a count of those dropped between
them; each message at most `MAX_MESSAGE` characters. The runner takes an attempt's records
when it ends (`take`): an attempt that logs nothing costs nothing.
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
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

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
        size = sum(len(v) for v in entry.values() if isinstance(v, str))
        if len(self.first) < FIRST and self.size + size <= MAX_BYTES:
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


class LogCapture(logging.Handler):
    """The handler: keeps the records of this worker's running attempts in `logs`, by
    the job's id and claim, until the runner takes them."""

    def __init__(self, *, worker: str, level: int, running: Callable[[Job], bool]) -> None:
        super().__init__(level)
        self.worker = worker
        self.running = running  # whether an attempt of this claim runs here now
        self.logs: dict[Key, AttemptLog] = {}

    def install(self) -> None:
        logging.getLogger().addHandler(self)

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)
        self.logs.clear()

    def take(self, job: Job) -> str | None:
        """The records of ``job``'s attempt as JSON, forgotten here (None: it logged none)."""
        found = self.logs.pop((job.id, job.claim), None)
        return None if found is None else found.json()

    def handle(self, record: logging.LogRecord) -> bool:
        # No lock: each attempt's records go to its own list (a plain def task's from its
        # one thread), and a dict's set and pop are atomic.
        if record.levelno >= self.level:
            job = self._attempt()
            if job is not None:
                self._keep(job, record)
        last_resort = logging.lastResort
        if (
            last_resort is not None
            and record.levelno >= last_resort.level
            and not self._other_handlers(record.name)
        ):
            last_resort.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() does it
        self.handle(record)

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

    def _keep(self, record_job: Job, record: logging.LogRecord) -> None:
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
        key = (record_job.id, record_job.claim)
        log = self.logs.get(key)
        if log is None:
            log = self.logs.setdefault(key, AttemptLog())
        log.add(entry)

    def _other_handlers(self, name: str) -> bool:
        """Whether a record of the logger ``name`` that reached the root logger met a
        handler other than this one on its way (else Python's last resort prints it)."""
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return True
            if not logger.propagate:
                return False
            logger = logger.parent
        return False


def level_of(name: str) -> int | None:
    """The level of ``--log-capture`` (None: off)."""
    return None if name == "off" else logging.getLevelName(name)
