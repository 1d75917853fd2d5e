"""Who may see and change what.

With a token, every page needs a session opened with it (the login page and the static assets
excepted), changes need the session's CSRF token, and failed logins are limited per browser
session and client address (:class:`LoginThrottle`). A login is also recorded server-side
(:class:`SessionStore`): logging out ends it, so a copy of the cookie no longer works.
Without a token the console is read-only and answers on the loopback interface only:
it shows payloads, errors and the relays' hosts, so it must not be reachable by anyone else.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request

from outbox.exceptions import ConfigurationError

__all__ = [
    "MIN_TOKEN_LENGTH",
    "SESSION_SECONDS",
    "Forbidden",
    "LoginThrottle",
    "SessionStore",
    "allowed_hosts",
    "check_change",
    "check_listen",
    "check_token",
    "csrf_token",
    "is_loopback",
    "is_remote",
    "log_in",
    "logged_in",
    "may_read",
]

MIN_TOKEN_LENGTH = 16
#: how long an operator session lasts (the cookie's max_age too)
SESSION_SECONDS = 8 * 3600
_LOCALHOST = ("127.0.0.1", "localhost", "[::1]")


class Forbidden(Exception):
    """The request may not change anything; the message says why and what to do."""


def check_token(token: str | None) -> None:
    """Refuse a token that is empty or shorter than :data:`MIN_TOKEN_LENGTH` (``None``: none)."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"the console token must have at least {MIN_TOKEN_LENGTH} characters "
            f"(it has {len(token)}): e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(24))'`, in OUTBOX_CONSOLE_TOKEN",
            setting="token",
        )


def is_loopback(host: str) -> bool:
    """``host`` (an address or ``localhost``) is the loopback interface."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_remote(address: str) -> bool:
    """``address`` is an IP address other than loopback (a name, such as a test client's, is
    not: only a socket's peer address is judged)."""
    try:
        ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return not is_loopback(address)


def check_listen(host: str, token: str | None) -> None:
    """Without a token the console listens on loopback only."""
    if token is None and not is_loopback(host):
        raise ConfigurationError(
            f"a console without a token listens on the loopback interface only (127.0.0.1, "
            f"::1, localhost), not on {host!r}: it shows every payload and error to whoever "
            "reaches it. Set a token (OUTBOX_CONSOLE_TOKEN, at least "
            f"{MIN_TOKEN_LENGTH} characters) so that every page needs a login, or listen on "
            "127.0.0.1 and reach it through an SSH tunnel",
            setting="host",
        )


def allowed_hosts(host: str, extra: Iterable[str] = ()) -> list[str]:
    """The Host header values the console answers: the address it listens on (unless it is
    a wildcard), the loopback names, and ``extra`` (the names operators reach it by). Anything
    else is refused, so a page of another site whose name resolves to this address (DNS
    rebinding) cannot read the console."""
    names = [*_LOCALHOST, *(h.strip().lower() for h in extra if h.strip())]
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        names.append(host.lower())
    else:
        if not address.is_unspecified:
            names.append(f"[{address}]" if address.version == 6 else str(address))
    return list(dict.fromkeys(names))


def csrf_token(request: Request) -> str:
    session: dict[str, Any] = request.session
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return str(session["csrf"])


def session_id(request: Request) -> str:
    """This browser session's id (made with its first page): the login throttle's key."""
    session: dict[str, Any] = request.session
    if "sid" not in session:
        session["sid"] = secrets.token_urlsafe(16)
    return str(session["sid"])


class SessionStore:
    """The operator sessions open now, server-side: a login's id in the (signed) cookie counts
    only while it is here, so logging out (or the end of its 8 hours) ends it for every copy of
    the cookie. In memory, for one console process; bounded (the oldest forgotten first)."""

    def __init__(
        self,
        seconds: float = SESSION_SECONDS,
        *,
        most: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seconds, self._most, self._clock = seconds, most, clock
        self._open: OrderedDict[str, float] = OrderedDict()

    def open(self) -> str:
        login = secrets.token_urlsafe(24)
        self._open[login] = self._clock() + self._seconds
        while len(self._open) > self._most:
            self._open.popitem(last=False)
        return login

    def is_open(self, login: object) -> bool:
        until = self._open.get(login) if isinstance(login, str) else None
        if until is None:
            return False
        if until <= self._clock():
            self._open.pop(str(login), None)
            return False
        return True

    def close(self, login: object) -> None:
        if isinstance(login, str):
            self._open.pop(login, None)


def _sessions(request: Request) -> SessionStore | None:
    store = getattr(getattr(request.app.state, "console", None), "sessions", None)
    return store if isinstance(store, SessionStore) else None


def logged_in(request: Request) -> bool:
    """An operator session that is open server-side (not logged out, not expired)."""
    if not request.session.get("operator"):
        return False
    store = _sessions(request)
    return store is not None and store.is_open(request.session.get("login"))


def log_out(request: Request) -> None:
    """End the session server-side and in the cookie; the browser stays known to the throttle
    (it logged in before, so others' failures from its address do not lock it out)."""
    store = _sessions(request)
    if store is not None:
        store.close(request.session.get("login"))
    request.session.clear()
    request.session["known"] = True


def may_read(request: Request, token: str | None) -> bool:
    """Without a token anyone (on loopback) may read; with one, a logged-in operator only."""
    return token is None or logged_in(request)


def log_in(request: Request, token: str | None, given: str, operator: str) -> bool:
    """Open an operator session when ``given`` is the console's token (compared in constant
    time); a new CSRF token goes with every new session."""
    if token is None or not hmac.compare_digest(given.encode(), token.encode()):
        return False
    store = _sessions(request)
    if store is None:
        return False
    request.session.clear()
    request.session["operator"] = operator
    request.session["csrf"] = secrets.token_urlsafe(32)
    request.session["login"] = store.open()
    request.session["known"] = True
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


class LoginThrottle:
    """At most ``attempts`` failed logins per key in ``window`` seconds.

    A login attempt's keys (:meth:`keys`): its browser session at its address, always; and its
    address alone, unless that browser logged in before. So fresh sessions (a script's) share
    their address's limit, while an operator's browser is never locked out by others'
    failures from the same address (a NAT, a proxy). The route checks and counts with no
    ``await`` in between, so concurrent attempts cannot all pass the check first.

    In memory, for one process; the keys kept are bounded (``clients``, the least recently
    failing forgotten first), so a flood of addresses cannot grow it without end.
    """

    def __init__(
        self,
        attempts: int = 5,
        window: float = 60.0,
        *,
        clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.attempts, self.window, self._clients, self._clock = attempts, window, clients, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    @staticmethod
    def keys(source: str, session: str, *, known: bool) -> tuple[str, ...]:
        """The keys a login of ``session`` from ``source`` counts against."""
        mine = f"{source} {session}"
        return (mine,) if known else (mine, source)

    def _recent(self, client: str) -> deque[float]:
        failures = self._failures.get(client, deque())
        horizon = self._clock() - self.window
        while failures and failures[0] <= horizon:
            failures.popleft()
        return failures

    def retry_after(self, *keys: str) -> int:
        """Seconds until a login counted against ``keys`` may try again (0: now)."""
        wait = 0
        for key in keys:
            failures = self._recent(key)
            if len(failures) >= self.attempts:
                wait = max(wait, max(1, math.ceil(failures[0] + self.window - self._clock())))
        return wait

    def failed(self, *keys: str) -> int:
        """Count a failed login against each of ``keys``; returns the most failures of one
        key within the window."""
        most = 0
        for key in keys:
            failures = self._recent(key)
            failures.append(self._clock())
            self._failures[key] = failures
            self._failures.move_to_end(key)
            most = max(most, len(failures))
        while len(self._failures) > self._clients:
            self._failures.popitem(last=False)
        return most

    def succeeded(self, *keys: str) -> None:
        for key in keys:
            self._failures.pop(key, None)
