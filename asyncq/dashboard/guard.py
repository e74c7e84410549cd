"""What every request and response of the dashboard goes through: the check of the
``Host`` it names (when it has a list of allowed hosts), its login (``asyncq dashboard``'s,
when set), the host's own authorization, and headers that keep a browser from running or
framing anything the page did not mean to."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asyncq.dashboard.hosts import AllowedHosts
from asyncq.dashboard.login import Login

Authorize = Callable[[Request], bool | str | Awaitable[bool | str]]
# Where the guard leaves who is asking, for the audit record of a bulk action: the name
# the authorize hook returned, else the login's user, else "local".
IDENTITY = "asyncq.identity"
LOCAL = "local"

# No script runs but the dashboard's own file (live.js: local times, live refresh), and
# no inline code at all, so a value on a page can never run; the script fetches the
# dashboard's own pages only. Styles only from the dashboard's own stylesheet; the chart
# is inline SVG drawn with presentation attributes, not styles.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self';"
    " img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
WRONG_HOST = (
    "bad request: the dashboard does not answer to this Host name; to allow it, start it"
    " with --allowed-host NAME (create_app(..., allowed_hosts=[...]) when mounted)\n"
)
NO_LOGIN = "unauthorized: the dashboard needs its login\n"


class Guard:
    """An ASGI middleware: refuses with 400 a ``Host`` outside ``hosts`` (when given), with
    401 a request without ``login`` (when given), with 403 whom ``authorize`` refuses
    (when given), in that order; leaves who asks in the scope (`IDENTITY`); adds the
    security headers to every response."""

    def __init__(
        self,
        app: ASGIApp,
        authorize: Authorize | None,
        *,
        hosts: AllowedHosts | None = None,
        login: Login | None = None,
    ) -> None:
        self.app = app
        self.authorize = authorize
        self.hosts = hosts
        self.login = login

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        headers = Headers(scope=scope)
        refusal = None
        identity = LOCAL
        if self.login is not None:
            identity = self.login.identity(headers.get("authorization")) or LOCAL
        if self.hosts is not None and not self.hosts.allows(
            headers.get("host", ""), scope["scheme"]
        ):
            refusal = PlainTextResponse(WRONG_HOST, status_code=400)
        elif self.login is not None and not self.login.admits(headers.get("authorization")):
            refusal = PlainTextResponse(NO_LOGIN, status_code=401)
            refusal.raw_headers += self.login.challenges()
        elif self.authorize is not None:
            verdict = await self.verdict(Request(scope, receive))
            if isinstance(verdict, str) and verdict:
                identity = verdict
            elif verdict is not True:
                refusal = PlainTextResponse("forbidden", status_code=403)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        scope[IDENTITY] = identity
        await self.app(scope, receive, send_with_headers)

    async def verdict(self, request: Request) -> bool | str:
        """What ``authorize`` says: True or a name (who asks) admits; anything else
        refuses."""
        assert self.authorize is not None
        verdict = self.authorize(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict
