"""The login of ``asyncq dashboard``, from its environment (a mounted dashboard has its
service's, through ``authorize``):

- ``ASYNCQ_DASHBOARD_USER`` and ``ASYNCQ_DASHBOARD_PASSWORD`` (both or neither): HTTP
  Basic, which a browser asks for;
- ``ASYNCQ_DASHBOARD_TOKEN``: ``Authorization: Bearer TOKEN``, for scripts and
  Prometheus.

With both set, either one lets in. Each secret is compared by its SHA-256 digest with
`hmac.compare_digest`, so neither the time taken nor the length tells what was close."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

USER = "ASYNCQ_DASHBOARD_USER"
PASSWORD = "ASYNCQ_DASHBOARD_PASSWORD"
TOKEN = "ASYNCQ_DASHBOARD_TOKEN"
REALM = "asyncq dashboard"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


class Login:
    def __init__(
        self, *, user: str | None = None, password: str | None = None, token: str | None = None
    ) -> None:
        if (user is None) != (password is None):
            raise ValueError(f"set both {USER} and {PASSWORD}, or neither")
        if user is None and token is None:
            raise ValueError(f"a login needs {USER} and {PASSWORD}, or {TOKEN}")
        for name, value in ((USER, user), (PASSWORD, password), (TOKEN, token)):
            if value is not None and not value.strip():
                raise ValueError(f"{name} is empty")
        if user is not None and ":" in user:
            raise ValueError(f"{USER} cannot hold a colon (HTTP Basic splits at it)")
        self._basic = None if user is None else (_digest(user), _digest(password or ""))
        self._token = None if token is None else _digest(token)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Login | None:
        """The login the environment sets, if any; ValueError if it sets half of one."""
        found = {name: environ.get(name) for name in (USER, PASSWORD, TOKEN)}
        if all(value is None for value in found.values()):
            return None
        return cls(user=found[USER], password=found[PASSWORD], token=found[TOKEN])

    @property
    def kinds(self) -> list[str]:
        return ["HTTP Basic"] * (self._basic is not None) + ["bearer token"] * (
            self._token is not None
        )

    def admits(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries this login."""
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() == "basic" and self._basic is not None:
            try:
                pair = base64.b64decode(credentials, validate=True).decode()
            except ValueError:  # not base64, or not UTF-8
                return False
            user, colon, password = pair.partition(":")
            # Both compared, whatever the first gives (`&`, not `and`).
            return (
                bool(colon)
                & hmac.compare_digest(_digest(user), self._basic[0])
                & hmac.compare_digest(_digest(password), self._basic[1])
            )
        if scheme.lower() == "bearer" and self._token is not None:
            return hmac.compare_digest(_digest(credentials), self._token)
        return False

    def identity(self, authorization: str | None) -> str | None:
        """Who an admitted ``Authorization`` names: the user of a basic login, "token"
        for the bearer token; None when it does not admit."""
        if not self.admits(authorization):
            return None
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        if scheme.lower() == "basic":
            return base64.b64decode(credentials.strip()).decode().partition(":")[0]
        return "token"

    def challenges(self) -> list[tuple[bytes, bytes]]:
        """The ``WWW-Authenticate`` headers of a refusal."""
        found = []
        if self._basic is not None:
            found.append(f'Basic realm="{REALM}", charset="UTF-8"')
        if self._token is not None:
            found.append(f'Bearer realm="{REALM}"')
        return [(b"www-authenticate", value.encode()) for value in found]
