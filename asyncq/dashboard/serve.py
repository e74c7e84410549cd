"""``asyncq dashboard``: the dashboard on its own, served by uvicorn in the running event
loop while the CLI holds the App open.

It answers to ``localhost``, ``127.0.0.1``, ``[::1]`` and the address it binds, each on
its port, and to the names given with ``--allowed-host`` (`asyncq.dashboard.hosts`). On
an address beyond loopback it needs a login (`asyncq.dashboard.login`), unless told
``--insecure-no-auth``."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping, Sequence

import uvicorn

from asyncq.app import App
from asyncq.dashboard.app import build
from asyncq.dashboard.hosts import AllowedHosts
from asyncq.dashboard.login import PASSWORD, TOKEN, USER, Login

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps other machines out (a name other than localhost
    may resolve to anything: it counts as beyond loopback)."""
    address = _address(host)
    return host.lower() == "localhost" if address is None else address.is_loopback


def allowed_hosts(host: str, port: int, extra: Sequence[str] = ()) -> AllowedHosts:
    """The loopback names and the bound address (not a wildcard such as 0.0.0.0, which
    no browser names), on ``port``; and ``extra`` as given (``NAME`` or ``NAME:PORT``)."""
    address = _address(host)
    names = list(LOOPBACK_NAMES)
    if address is None:
        names += [host] if host else []
    elif not address.is_unspecified:
        names.append(f"[{address}]" if address.version == 6 else str(address))
    try:
        AllowedHosts(extra)
    except ValueError as exc:
        raise ValueError(f"--allowed-host {exc}") from None
    return AllowedHosts([*(f"{name}:{port}" for name in dict.fromkeys(names)), *extra])


def login_for(host: str, *, insecure_no_auth: bool, environ: Mapping[str, str]) -> Login | None:
    """The login the environment sets; ValueError (one line) when it sets half of one, or
    none while ``host`` is beyond loopback and ``insecure_no_auth`` is not given."""
    login = Login.from_environ(environ)
    if login is None and not is_loopback(host) and not insecure_no_auth:
        raise ValueError(
            f"the dashboard on {host} would have no login: set {USER} and {PASSWORD}"
            f" (HTTP Basic) or {TOKEN} (bearer), or pass --insecure-no-auth"
        )
    return login


async def serve(
    app: App,
    *,
    host: str,
    port: int,
    read_only: bool,
    hosts: AllowedHosts,
    login: Login | None,
) -> None:
    if login is None and not is_loopback(host):
        logger.warning(
            "the dashboard on %s has no login (--insecure-no-auth): anyone who reaches it"
            " can see and act",
            host,
            extra={"action": "dashboard_without_login"},
        )
    elif login is not None:
        logger.info(
            "the dashboard needs its login (%s)",
            " or ".join(login.kinds),
            extra={"action": "dashboard_login"},
        )
    config = uvicorn.Config(
        build(app, read_only=read_only, authorize=None, secret=None, hosts=hosts, login=login),
        host=host,
        port=port,
        log_config=None,  # the CLI has configured logging
        lifespan="on",  # the dashboard's own: its bulk actions stop when it does
        server_header=False,
    )
    await uvicorn.Server(config).serve()
