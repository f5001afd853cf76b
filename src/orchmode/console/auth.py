"""Who may use the console: the access token (query once, then a cookie), the CSRF check
on every POST, and the security headers on every answer."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "orchmode_console"

#: No inline script and nothing from elsewhere; the report's sections keep a few inline
#: style attributes (bar widths), which cannot run anything.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer a browser's form says ``Origin: null``,
    # and the POST check could not tell the console's own forms from another site's
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Access:
    """The server's secret: the token in the URL it prints, and the CSRF token its forms
    carry (derived from it, so nothing else need be kept per browser)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_urlsafe(32)
        self.csrf = hmac.new(self.token.encode(), b"csrf", hashlib.sha256).hexdigest()

    def url(self, base: str) -> str:
        return f"{base}/?{urlencode({'token': self.token})}"

    def admits(self, request: Request) -> bool:
        return _same(request.cookies.get(COOKIE), self.token)

    async def allows_post(self, request: Request) -> str | None:
        """Why this POST is refused (None when it is not): it must come from this console's
        own pages (same origin) and carry the form's CSRF token."""
        if not _same_origin(request):
            return "cross-site request refused"
        form = await request.form()
        sent = form.get("csrf")
        if not isinstance(sent, str) or not _same(sent, self.csrf):
            return "missing or wrong CSRF token — reload the page"
        return None


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _same_origin(request: Request) -> bool:
    """A browser says where a request comes from (``Sec-Fetch-Site``, ``Origin``); one that
    says neither is no browser's form, and is refused too."""
    site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    if site is None and origin is None:
        return False
    if site is not None and site != "same-origin":
        return False
    if origin is not None:
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        return origin == own
    return True


class Guard:
    """ASGI middleware: the token check before any route, the headers after every one."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        response = self._refusal_or_entry(request)
        if response is not None:
            await response(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)

    def _refusal_or_entry(self, request: Request) -> Response | None:
        """401 without the token; the first visit with ``?token=`` sets the cookie and goes
        on to the same address without it (so the token stays out of history and logs)."""
        given = request.query_params.get("token")
        if given is not None and _same(given, self.access.token):
            rest = urlencode(
                [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            )
            location = request.url.path + (f"?{rest}" if rest else "")
            response: Response = RedirectResponse(location, 303)
            response.set_cookie(
                COOKIE, self.access.token, httponly=True, samesite="strict", path="/"
            )
        elif self.access.admits(request):
            return None
        else:
            response = PlainTextResponse(
                "401: this console needs the token in the URL `orchmode serve` printed\n", 401
            )
        for name, value in SECURITY_HEADERS.items():
            response.headers[name] = value
        return response
