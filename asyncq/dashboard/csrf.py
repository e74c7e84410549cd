"""Cross-site request forgery: every action is a POST that carries a token only the
dashboard's own pages hold.

A random nonce lives in an HttpOnly, SameSite=Strict cookie; each form carries
HMAC(secret, nonce). A POST passes when its token matches its cookie's nonce under the
secret. Unlike a plain double-submit (the same value in cookie and form), a cookie
planted by a sibling site is not enough: forging the form's token needs the secret,
which is random per process unless the host gives one (several processes behind one
address must share it). A POST whose Origin header names another host is refused too."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "asyncq_csrf"
FIELD = "csrf"
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")


class Csrf:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret else secrets.token_bytes(32)

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
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            return False
        return hmac.compare_digest(self.token(nonce), given)
