"""Cross-site request forgery: every action is a POST that carries a token only the
dashboard's own pages hold.

A random nonce lives in an HttpOnly, SameSite=Strict cookie; each form carries
HMAC(secret, nonce). A POST passes when its token matches its cookie's nonce under the
secret. Unlike a plain double-submit (the same value in cookie and form), a cookie
planted by a sibling site is not enough: forging the form's token needs the secret,
which is random per process unless the host gives one (several processes behind one
address must share it).

A POST whose ``Origin`` (or, without one, whose ``Referer``) names a host the dashboard
does not answer to is refused too: one of its allowed hosts (`asyncq.dashboard.hosts`)
when it has a list, else the request's own ``Host``. A POST with neither header (not a
browser's) needs the token all the same."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from asyncq.dashboard.hosts import AllowedHosts, split

COOKIE = "asyncq_csrf"
FIELD = "csrf"
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")


class Csrf:
    def __init__(self, secret: bytes | None = None, hosts: AllowedHosts | None = None) -> None:
        self._secret = secret if secret else secrets.token_bytes(32)
        self._hosts = hosts

    def token(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def nonce(self, request: Request) -> tuple[str, bool]:
        """The request's nonce, and whether it is new (the response must set it)."""
        found = request.cookies.get(COOKIE, "")
        if _NONCE.fullmatch(found):
            return found, False
        return secrets.token_urlsafe(32), True

    def set_cookie(self, request: Request, response: Response, nonce: str) -> None:
        response.set_cookie(
            COOKIE,
            nonce,
            path=request.scope.get("root_path") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def valid(self, request: Request, given: str) -> bool:
        nonce = request.cookies.get(COOKIE, "")
        if not _NONCE.fullmatch(nonce) or not given:
            return False
        if not self.from_own_page(request):
            return False
        return hmac.compare_digest(self.token(nonce), given)

    def from_own_page(self, request: Request) -> bool:
        """Whether the page that sent the request is one of the dashboard's own."""
        source = request.headers.get("origin")
        if source is None:
            source = request.headers.get("referer")
            if source is None:
                return True
        try:
            url = urlsplit(source)
        except ValueError:  # an unclosed "[" in the name
            return False
        if self._hosts is not None:
            return self._hosts.allows(url.netloc, url.scheme)
        sender = split(url.netloc, url.scheme)
        return sender is not None and sender == split(
            request.headers.get("host", ""), request.url.scheme
        )
