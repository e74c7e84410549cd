"""What every response of the dashboard goes through: the host's own authorization, and
headers that keep a browser from running or framing anything the page did not mean to."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Authorize = Callable[[Request], bool | Awaitable[bool]]

# No script may run at all: the pages need none. Styles only from the dashboard's own
# stylesheet; the chart is inline SVG drawn with presentation attributes, not styles.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
    " frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class Guard:
    """An ASGI middleware: refuses with 403 whom ``authorize`` refuses (when given), and
    adds the security headers to every response."""

    def __init__(self, app: ASGIApp, authorize: Authorize | None) -> None:
        self.app = app
        self.authorize = authorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        if self.authorize is not None and not await self.allowed(Request(scope, receive)):
            refusal = PlainTextResponse("forbidden", status_code=403)
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    async def allowed(self, request: Request) -> bool:
        assert self.authorize is not None
        verdict = self.authorize(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True
