"""Which names the dashboard answers to.

Binding to 127.0.0.1 keeps other machines out, not other web pages: a page whose own name
its owner rebinds to 127.0.0.1 (DNS rebinding) reaches the dashboard through the user's
browser, as the same origin, with its own name in the ``Host`` header. So the dashboard
refuses any ``Host`` outside a short list, and accepts an action's ``Origin`` (or its
``Referer``) only from that list.

An entry is ``NAME`` (any port) or ``NAME:PORT``; an IPv6 address in brackets,
``[::1]:8080``. Names compare without case; a ``Host`` without a port has its scheme's.
Starlette's ``TrustedHostMiddleware`` compares names only, and older releases split
``[::1]:8080`` at its first colon: hence this."""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_NOT_IN_A_NAME = frozenset("/\\@?#%[] \t")


def _parse(text: str) -> tuple[str, int | None] | None:
    """``NAME[:PORT]`` as a lower-case name and the port, if given; None if it is not one."""
    text = text.lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 2:
            return None
        name, rest = text[: end + 1], text[end + 1 :]
        if any(c in _NOT_IN_A_NAME or c.isspace() for c in name[1:-1]):
            return None
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] if rest else None
    else:
        name, colon, after = text.partition(":")
        port = after if colon else None
        if not name or any(c in _NOT_IN_A_NAME or c.isspace() for c in name):
            return None
    if port is None:
        return name, None
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return name, int(port)


def split(netloc: str, scheme: str) -> tuple[str, int] | None:
    """A ``Host`` header (or a URL's netloc) as a name and a port (the scheme's when it
    names none); None when it is not a host."""
    parsed = _parse(netloc)
    if parsed is None:
        return None
    name, port = parsed
    if port is None:
        port = DEFAULT_PORTS.get(scheme)
    return None if port is None else (name, port)


class AllowedHosts:
    def __init__(self, entries: Iterable[str]) -> None:
        self._any_port: set[str] = set()
        self._exact: set[tuple[str, int]] = set()
        for entry in entries:
            parsed = _parse(entry.strip())
            if parsed is None:
                raise ValueError(f"{entry!r} is not a host: NAME or NAME:PORT ([::1]:8080)")
            name, port = parsed
            if port is None:
                self._any_port.add(name)
            else:
                self._exact.add((name, port))

    def allows(self, netloc: str, scheme: str) -> bool:
        host = split(netloc, scheme)
        return host is not None and (host[0] in self._any_port or host in self._exact)
