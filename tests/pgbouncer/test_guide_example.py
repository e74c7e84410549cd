"""The PgBouncer guide (docs/how-to/pgbouncer.md), tested: its ``pgbouncer.ini`` runs (its
``[pgbouncer]`` settings as they are, but for the addresses and the authentication, which
are the test's), and ``examples/pgbouncer.py`` runs through it, listening straight to the
server and without LISTEN; the guide's App is configured as it says."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import asyncq
from tests.harness.pgbouncer import PgBouncer
from tests.pgbouncer.conftest import start

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pgbouncer.py"
# Where and whom PgBouncer serves: the test's own.
SITE = {
    "listen_addr",
    "listen_port",
    "unix_socket_dir",
    "auth_type",
    "auth_file",
    "admin_users",
    "logfile",
    "pidfile",
}


GUIDE = ROOT / "docs" / "how-to" / "pgbouncer.md"


def guide_block(language: str) -> str:
    [block] = re.findall(rf"^```{language}\n(.*?)```", GUIDE.read_text("utf-8"), re.S | re.M)
    return str(block)


def guide_settings() -> dict[str, str]:
    ini = configparser.ConfigParser(inline_comment_prefixes=(";",))
    ini.read_string(guide_block("ini"))
    return dict(ini["pgbouncer"])


def test_the_guide_says_what_asyncq_needs() -> None:
    settings = guide_settings()
    assert settings["pool_mode"] == "transaction"
    assert not settings.get("ignore_startup_parameters")
    assert "server_reset_query" not in settings
    assert int(settings["default_pool_size"]) >= 2
    names: dict[str, object] = {"asyncq": asyncq}
    exec(guide_block("python"), names)  # an App connects only when it opens
    app = names["app"]
    assert isinstance(app, asyncq.App)
    assert app.listen and app.prepare_threshold is None
    assert app._listen_dsn_argument and "5432" in app._listen_dsn_argument


@pytest.fixture
def guide_bouncer(pgbouncer_binary: str, server_dsn: str) -> Iterator[PgBouncer]:
    extra = {k: v for k, v in guide_settings().items() if k not in SITE}
    bouncer = start(pgbouncer_binary, server_dsn, extra=extra)
    yield bouncer
    bouncer.close()


@pytest.mark.parametrize("listen", [True, False], ids=["listen_dsn", "no-listen"])
def test_the_example_through_the_guides_pgbouncer(
    guide_bouncer: PgBouncer, throwaway_dsn: str, listen: bool
) -> None:
    assert "pool_mode = transaction" in guide_bouncer.ini()
    env = {**os.environ, "ASYNCQ_DSN": guide_bouncer.through(throwaway_dsn)}
    env.pop("ASYNCQ_LISTEN_DSN", None)
    if listen:
        env["ASYNCQ_LISTEN_DSN"] = throwaway_dsn
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert (
        "122 results, the first {'order_id': 1, 'total_cents': 1370},"
        " the last {'order_id': 122, 'total_cents': 10}"
    ) in output, output
    assert ("LISTEN: straight to the server" if listen else "LISTEN: none, polling") in output
    assert "Traceback" not in output and "WARNING" not in output, output
