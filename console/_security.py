"""Who may change what: read-only without a token; with one, changes need a session opened
with it, and every form carries the session's CSRF token."""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from starlette.requests import Request

__all__ = ["Forbidden", "check_change", "csrf_token", "log_in", "logged_in"]


class Forbidden(Exception):
    """The request may not change anything; the message says why and what to do."""


def csrf_token(request: Request) -> str:
    session: dict[str, Any] = request.session
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return str(session["csrf"])


def logged_in(request: Request) -> bool:
    return bool(request.session.get("operator"))


def log_in(request: Request, token: str | None, given: str, operator: str) -> bool:
    """Open an operator session when ``given`` is the console's token (compared in constant
    time); a new CSRF token goes with every new session."""
    if token is None or not hmac.compare_digest(given.encode(), token.encode()):
        return False
    request.session.clear()
    request.session["operator"] = operator
    request.session["csrf"] = secrets.token_urlsafe(32)
    return True


def check_change(request: Request, token: str | None, form: Any) -> str:
    """The operator's name, or Forbidden: read-only console, no session, or a bad CSRF token."""
    if token is None:
        raise Forbidden(
            "this console is read-only: start it with a token (--token or OUTBOX_CONSOLE_TOKEN) "
            "to requeue or purge"
        )
    if not logged_in(request):
        raise Forbidden("log in with the console's token first")
    sent = str(form.get("csrf", ""))
    expected = str(request.session.get("csrf", ""))
    if not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page and retry")
    return str(request.session["operator"])
