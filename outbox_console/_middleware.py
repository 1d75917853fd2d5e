"""The middleware around every request, outermost first: a trusted proxy's forwarded headers
(only from ``trusted_proxy``), the security headers, the Host allow-list, loopback clients only
(without a token), the session cookie, and the gate (a login first, with a token; no form
larger than :data:`MAX_FORM_BYTES`). Who may see and change what: ``_security.py``."""

from __future__ import annotations

import secrets
from typing import Any

from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.middleware.sessions import SessionMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from outbox_console._render import Pages
from outbox_console._security import is_remote, may_read
from outbox_console._settings import Settings

__all__ = ["MAX_FORM_BYTES", "middleware"]

#: the largest form a change or a login may post
MAX_FORM_BYTES = 64 * 1024

_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def middleware(settings: Settings, pages: Pages) -> list[Middleware]:
    """The console's middleware, outermost first."""
    stack = [Middleware(BaseHTTPMiddleware, dispatch=_security_headers)]
    if settings.proxies:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        stack.insert(0, Middleware(ProxyHeadersMiddleware, trusted_hosts=settings.proxies))
    stack.append(
        Middleware(TrustedHostMiddleware, allowed_hosts=settings.hosts, www_redirect=False)
    )
    if settings.token is None:
        stack.append(Middleware(_LoopbackClientsOnly))
    stack += [
        Middleware(_Sessions, secure=settings.secure_cookie),
        Middleware(BaseHTTPMiddleware, dispatch=_Gate(settings.token, pages)),
    ]
    return stack


async def _security_headers(request: Request, call_next: RequestResponseEndpoint) -> Response:
    response = await call_next(request)
    response.headers.update(_SECURITY_HEADERS)
    return response


class _LoopbackClientsOnly:
    """Without a token: a request from another machine is refused, however the server was
    started (``create_app`` checks the address it is told; this checks every client)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] == "http" and client and is_remote(str(client[0])):
            refused = PlainTextResponse(
                "this console has no token, so it answers loopback clients only", 403
            )
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _Sessions:
    """The session cookie, marked Secure when the request came over HTTPS (directly, or as a
    trusted proxy says) or when ``secure`` forces it."""

    def __init__(self, app: ASGIApp, *, secure: bool) -> None:
        options: dict[str, Any] = {
            "secret_key": secrets.token_urlsafe(32),
            "session_cookie": "outbox_console",
            "same_site": "strict",
            "max_age": 8 * 3600,
        }
        self.plain = SessionMiddleware(app, https_only=secure, **options)
        self.tls = SessionMiddleware(app, https_only=True, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chosen = self.tls if scope.get("scheme") in ("https", "wss") else self.plain
        await chosen(scope, receive, send)


class _Gate:
    """With a token, nothing but the login page and the assets without a session; no form
    larger than :data:`MAX_FORM_BYTES`."""

    def __init__(self, token: str | None, pages: Pages) -> None:
        self._token, self._pages = token, pages

    async def __call__(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        path = request.url.path
        if request.method == "POST":
            length = request.headers.get("content-length", "")
            if not length.isdigit() or int(length) > MAX_FORM_BYTES:
                return self._pages.problem(
                    request, 413, f"a form of at most {MAX_FORM_BYTES} bytes"
                )
        if may_read(request, self._token) or path == "/login" or path.startswith("/static/"):
            return await call_next(request)
        if request.method in ("GET", "HEAD"):
            return RedirectResponse("/login", status_code=303)
        return self._pages.problem(request, 403, "log in with the console's token first")
