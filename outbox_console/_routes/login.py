"""Logging in (``/login``: the operator's name and the console's token, failures limited per
client address) and out (``/logout``)."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from outbox_console._security import log_in, log_out, logged_in, session_id
from outbox_console._state import console_of

__all__ = ["MAX_OPERATOR", "routes"]

log = logging.getLogger("outbox.console")

#: the longest operator name (it goes into every audit row)
MAX_OPERATOR = 100


async def login(request: Request) -> Response:
    pages = console_of(request).pages
    if request.method == "GET":
        session_id(request)
        return pages.render(request, "login.html")
    form = await request.form()
    # From here to the answer nothing awaits: the limit's check and its count are one step,
    # so concurrent attempts cannot all pass the check before any of them is counted.
    throttle = console_of(request).throttle
    client = request.client.host if request.client else "unknown"
    keys = throttle.keys(client, session_id(request), known=bool(request.session.get("known")))
    wait = throttle.retry_after(*keys)
    if wait:
        answer = pages.render(
            request,
            "login.html",
            429,
            problem=f"too many failed logins from your address: try again in {wait} s",
        )
        answer.headers["Retry-After"] = str(wait)
        return answer
    return _check_login(request, form, client, keys)


def _check_login(request: Request, form: Any, client: str, keys: tuple[str, ...]) -> Response:
    """A posted login form from ``client``, which may try now (synchronous: see login)."""
    console = console_of(request)
    if str(form.get("csrf", "")) != request.session.get("csrf"):
        return console.pages.problem(request, 403, "stale login form: reload it")
    operator = str(form.get("operator") or "").strip()
    if not operator or len(operator) > MAX_OPERATOR or not operator.isprintable():
        return console.pages.render(
            request,
            "login.html",
            400,
            problem=f"give your name (for the audit; at most {MAX_OPERATOR} characters)",
        )
    if not log_in(request, console.settings.token, str(form.get("token", "")), operator):
        failures = console.throttle.failed(*keys)
        log.warning(
            "console: failed login from %s as %r (%d within %.0f s)",
            client,
            operator,
            failures,
            console.throttle.window,
        )
        return console.pages.render(request, "login.html", 403, problem="wrong token")
    console.throttle.succeeded(keys[0])
    log.info("console: %r logged in from %s", operator, client)
    return RedirectResponse("/", status_code=303)


async def logout(request: Request) -> Response:
    form = await request.form()
    if logged_in(request) and str(form.get("csrf", "")) == request.session.get("csrf"):
        log_out(request)  # server-side too: a copy of the cookie no longer works
    return RedirectResponse("/", status_code=303)


routes = [
    Route("/login", login, methods=["GET", "POST"]),
    Route("/logout", logout, methods=["POST"]),
]
