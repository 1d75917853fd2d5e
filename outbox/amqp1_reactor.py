"""Qpid Proton (AMQP 1.0) meets asyncio: proton's reactor on a thread of its own.

Proton is callback driven: a ``Container`` runs handlers on the thread that runs it. The relay's
adapter and the inbox's consumer each run one container on a daemon thread and talk to it in
whole batches: :meth:`Reactor.call` queues a function and wakes the reactor through an
``EventInjector``; the function runs on the reactor thread, where every proton object lives,
and hands its results back with ``loop.call_soon_threadsafe``. One wake-up and one hand-back per
batch (not per message) keeps the thread crossing off the per-message path.

Connection options (URL, SASL, TLS) are parsed here once for both: ``amqp1://`` (plain TCP,
port 5672) and ``amqp1s://`` (TLS, port 5671), ``[user:password@]host[:port]``. The password is
handed to proton apart from the URL, so it never appears in proton's log lines, and
:func:`safe_url` is the only form of the URL written anywhere.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from outbox._optional import require
from outbox.exceptions import ConfigurationError

__all__ = ["Endpoint", "Reactor", "connect_options", "endpoint", "fail", "resolve", "safe_url"]

T = TypeVar("T")

log = logging.getLogger("outbox.amqp1")

SCHEMES = {"amqp1": 5672, "amqp1s": 5671}


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: never shown whole (see :meth:`shown`)."""

    host: str
    port: int
    tls: bool
    user: str | None
    password: str | None = None

    @property
    def proton_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'amqps' if self.tls else 'amqp'}://{host}:{self.port}"

    def shown(self) -> str:
        """The endpoint for logs and errors: the user name, never the password."""
        who = f"{self.user}@" if self.user else ""
        return f"{'amqp1s' if self.tls else 'amqp1'}://{who}{self.host}:{self.port}"


def endpoint(url: str) -> Endpoint:
    """Parse ``amqp1[s]://[user[:password]@]host[:port]``; percent-escapes in the user and
    password are decoded (a Service Bus SAS key holds ``/``, ``+`` and ``=``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"AMQP 1.0 URL {safe_url(url)!r} must start with amqp1:// or amqp1s:// (TLS)"
        )
    if parts.path not in ("", "/") or parts.query:
        raise ConfigurationError(
            f"AMQP 1.0 URL {safe_url(url)!r} has a path or query: the address (queue, topic) "
            "of each outbox topic is set by destinations, e.g. {'*': '/queue/{topic}'}"
        )
    try:
        port = parts.port or SCHEMES[scheme]
    except ValueError as exc:
        raise ConfigurationError(f"AMQP 1.0 URL {safe_url(url)!r} has an invalid port") from exc
    return Endpoint(
        host=parts.hostname or "127.0.0.1",
        port=port,
        tls=scheme == "amqp1s",
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def safe_url(url: str) -> str:
    """``url`` without its password."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"


def connect_options(
    ep: Endpoint,
    *,
    sasl_mechanisms: str | None,
    tls_ca: str | None,
    tls_verify: bool,
    virtual_host: str | None,
    heartbeat: float | None,
) -> dict[str, Any]:
    """The keyword arguments of ``Container.connect`` for ``ep`` (no reconnecting: the caller
    decides when to connect again)."""
    proton = require("proton", "amqp1")
    options: dict[str, Any] = {
        "url": ep.proton_url,
        "reconnect": False,
        # PLAIN with a user (over TLS, or plain TCP on a trusted network), else ANONYMOUS
        "allowed_mechs": sasl_mechanisms or ("PLAIN" if ep.user else "ANONYMOUS"),
        "allow_insecure_mechs": True,
    }
    if ep.user:
        options["user"] = ep.user
        options["password"] = ep.password or ""
    if virtual_host:
        options["virtual_host"] = virtual_host
    if heartbeat:
        options["heartbeat"] = heartbeat
    if ep.tls:
        domain = proton.SSLDomain(proton.SSLDomain.MODE_CLIENT)
        trusted = tls_ca or _system_cas()
        if trusted:
            domain.set_trusted_ca_db(trusted)
        if tls_verify:
            domain.set_peer_authentication(proton.SSLDomain.VERIFY_PEER_NAME, trusted)
        else:
            domain.set_peer_authentication(proton.SSLDomain.ANONYMOUS_PEER)
        options["ssl_domain"] = domain
    return options


def _system_cas() -> str | None:
    """The system's CA file (or directory), as Python's ssl module finds OpenSSL's: handed to
    proton explicitly, so a public CA's certificate is checked whatever proton was built with."""
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile, paths.capath, paths.openssl_capath):
        if path and os.path.exists(path):
            return path
    return None


class Reactor:
    """A proton ``Container`` running ``handler`` on a daemon thread; :meth:`call` and
    :meth:`run` run functions on that thread."""

    def __init__(self, handler: Any, name: str) -> None:
        reactor = require("proton.reactor", "amqp1")
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._injector = reactor.EventInjector()
        self._event = reactor.ApplicationEvent("outbox_call")
        self.container = reactor.Container(handler, _Calls(self._calls))
        self.container.selectable(self._injector)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.container.run()
        except BaseException as exc:  # the caller finds the thread dead and reconnects
            log.error("AMQP 1.0 reactor thread %s stopped: %s: %s", self._thread.name,
                      type(exc).__name__, exc)  # fmt: skip
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the reactor thread, soon; returns at once."""
        self._calls.append(fn)
        self._injector.trigger(self._event)

    async def run(self, fn: Callable[[], T], timeout: float) -> T:  # noqa: ASYNC109
        """Run ``fn()`` on the reactor thread and return its result (or raise its exception);
        TimeoutError after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def task() -> None:
            try:
                result = fn()
            except Exception as exc:
                loop.call_soon_threadsafe(_set_exception, future, exc)
            else:
                loop.call_soon_threadsafe(_set_result, future, result)

        self.call(task)
        return await asyncio.wait_for(future, timeout)

    def stop(self, timeout: float) -> None:
        """Let the reactor finish (call the connection's ``close`` first) and wait for the
        thread: closing the injector ends ``run()`` once the connection's close handshake is
        done, so the broker learns at once that the unsettled deliveries are free again.
        After ``timeout`` seconds the container is stopped without it."""
        self._injector.close()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.container.stop()  # a flag the loop reads on its next wake-up (a timer at most)
            self._thread.join(timeout)


def _set_result(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class _Calls:
    """Runs the queued functions when the injector wakes the reactor."""

    def __init__(self, calls: collections.deque[Callable[[], None]]) -> None:
        self._calls = calls

    def on_outbox_call(self, _event: Any) -> None:
        while self._calls:
            self._calls.popleft()()


def resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future[T], result: T) -> None:
    """Set ``future``'s result from the reactor thread."""
    loop.call_soon_threadsafe(_set_result, future, result)


def fail(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], exc: BaseException) -> None:
    """Set ``future``'s exception from the reactor thread."""
    loop.call_soon_threadsafe(_set_exception, future, exc)
