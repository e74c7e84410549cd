"""A real PgBouncer (Debian's ``pgbouncer``) in transaction pooling mode, in front of the
test server, for the tests in ``tests/pgbouncer``.

Each `PgBouncer` is a process of its own, on a free port of 127.0.0.1, with its own ini
file in a new folder under the temporary directory (``pgb-*``). It serves every database
of the server (``* =``) to the test server's user (``auth_type = trust`` towards its
clients; towards the server, the password of the test DSN, if it has one). Its pools
are small (``default_pool_size``, 2 unless told), so that one client's transactions
land on different server connections: whatever asyncq kept in a session would show.
Nothing else is configured: ``ignore_startup_parameters`` is empty and
``server_reset_query`` is left at its default (transaction mode does not run it).
``extra`` settings replace the test's own (the PgBouncer guide's, for its example).

As root, PgBouncer (which refuses to run as root) runs as ``nobody``, and its folder is
``nobody``'s. Its log (stderr) goes to ``pgbouncer.log`` in the folder. A server on a
Unix socket (the embedded one, whose socket lies in root's home, where ``nobody`` may
not go) is reached through a `SocketRelay` on 127.0.0.1 in the test process.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

CANDIDATES = ("pgbouncer", "/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
RUN_AS_WHEN_ROOT = "nobody"


def binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    for candidate in CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def version(executable: str) -> tuple[int, ...]:
    """PgBouncer's version, from ``pgbouncer --version`` (``PgBouncer 1.18.0``)."""
    out = subprocess.run(
        [executable, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise RuntimeError(f"cannot tell pgbouncer's version from {out!r}")
    return tuple(int(part or 0) for part in match.groups())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SocketRelay:
    """A TCP port of 127.0.0.1 whose connections are passed on to a Unix socket, by
    threads of its own, until `close`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.path)
            except OSError:
                client.close()
                upstream.close()
                continue
            self.open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class PgBouncer:
    """One pgbouncer process in front of the server of ``server_dsn``."""

    def __init__(
        self,
        executable: str,
        server_dsn: str,
        *,
        pool_size: int = 2,
        max_prepared_statements: int | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.executable = executable
        self.version = version(executable)
        server = conninfo_to_dict(server_dsn)
        self.user = str(server.get("user") or getpass.getuser())
        self.password = str(server.get("password") or "")
        self.server_host = str(server.get("host") or "localhost")
        self.server_port = str(server.get("port") or "5432")
        self.relay: SocketRelay | None = None
        if self.server_host.startswith("/") and os.geteuid() == 0:
            self.relay = SocketRelay(f"{self.server_host}/.s.PGSQL.{self.server_port}")
            self.server_host, self.server_port = "127.0.0.1", str(self.relay.port)
        self.pool_size = pool_size
        self.max_prepared_statements = max_prepared_statements
        self.extra = dict(extra or {})
        self.folder = Path(tempfile.mkdtemp(prefix="pgb-"))
        self.log = self.folder / "pgbouncer.log"
        self.port = 0
        self.popen: subprocess.Popen[bytes] | None = None

    # -- DSNs -------------------------------------------------------------------------

    def dsn(self, database: str) -> str:
        """A DSN for ``database`` through this PgBouncer."""
        return make_conninfo(host="127.0.0.1", port=self.port, user=self.user, dbname=database)

    def through(self, dsn: str) -> str:
        """``dsn`` (a database of the test server) through this PgBouncer."""
        return self.dsn(str(conninfo_to_dict(dsn)["dbname"]))

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        """A connection to PgBouncer's admin console (``SHOW CLIENTS``, ``SHOW POOLS``)."""
        return psycopg.connect(self.dsn("pgbouncer"), autocommit=True, prepare_threshold=None)

    def clients(self) -> list[dict[str, object]]:
        """``SHOW CLIENTS``: one dict per client connection."""
        with self.admin() as conn:
            cur = conn.execute("SHOW CLIENTS")
            names = [column.name for column in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    # -- the process ------------------------------------------------------------------

    def settings(self) -> dict[str, str]:
        """The ``[pgbouncer]`` section: the test's own, then ``extra`` over it."""
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.folder / "users.txt"),
            "admin_users": self.user,
            "pool_mode": "transaction",
            "default_pool_size": str(self.pool_size),
            "min_pool_size": "0",
            "reserve_pool_size": "0",
            "max_client_conn": "500",
            # A client that waits this long for a server connection gets an error rather
            # than hanging the test.
            "query_wait_timeout": "60",
            "logfile": "",
            "log_connections": "0",
            "log_disconnections": "0",
        }
        if self.max_prepared_statements is not None:
            settings["max_prepared_statements"] = str(self.max_prepared_statements)
        settings.update(self.extra)
        return settings

    def ini(self) -> str:
        lines = [f"{key} = {value}".rstrip() for key, value in self.settings().items()]
        return (
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "\n"
            "[pgbouncer]\n" + "\n".join(lines) + "\n"
        )

    def start(self, timeout: float = 15) -> PgBouncer:
        quoted_password = self.password.replace('"', '""')
        (self.folder / "users.txt").write_text(f'"{self.user}" "{quoted_password}"\n')
        args = [self.executable]
        owner = pwd.getpwnam(RUN_AS_WHEN_ROOT) if os.geteuid() == 0 else None
        if owner is not None:
            args += ["-u", RUN_AS_WHEN_ROOT]
        for _ in range(5):  # a free port may be taken by someone else before we bind it
            self.port = free_port()
            ini = self.folder / "pgbouncer.ini"
            ini.write_text(self.ini())
            if owner is not None:
                for path in (self.folder, *self.folder.iterdir()):
                    os.chown(path, owner.pw_uid, owner.pw_gid)
            with self.log.open("ab") as log:
                self.popen = subprocess.Popen(
                    [*args, str(ini)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
                )
            if self._wait_ready(timeout):
                return self
            self.stop()
        raise RuntimeError(f"pgbouncer did not start; its log:\n{self.log.read_text()}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.popen is not None
            if self.popen.poll() is not None:
                return False
            with contextlib.suppress(psycopg.OperationalError), self.admin():
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        popen, self.popen = self.popen, None
        if popen is None or popen.poll() is not None:
            return
        popen.terminate()
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

    def close(self) -> None:
        """Stop the process and remove its folder."""
        self.stop()
        if self.relay is not None:
            self.relay.close()
        shutil.rmtree(self.folder, ignore_errors=True)
