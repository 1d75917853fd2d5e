"""The console's web application (Starlette, Jinja2 templates, Chart.js; every asset packaged).

Its parts: the settings (``_settings.py``), who may see and change what (``_security.py``,
``_middleware.py``), the reads and changes on a pool opened for the app's lifetime
(``_data.py``), the pages (``_render.py``, ``templates/``) and the routes, one module per page
(``_routes/``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from outbox.exceptions import OutboxError
from outbox.kit import redact
from outbox.trace import TraceSource
from outbox_console._middleware import middleware
from outbox_console._routes import routes
from outbox_console._settings import settings
from outbox_console._state import Console, console_of

__all__ = ["create_app"]


def create_app(
    url: str,
    *,
    token: str | None = None,
    schema: str | None = None,
    sample_seconds: float = 10.0,
    host: str = "127.0.0.1",
    allowed_host: Iterable[str] = (),
    reports_dir: str | Path | None = None,
    secure_cookie: bool = False,
    trusted_proxy: Iterable[str] = (),
    pool_size: int = 4,
    inboxes: Iterable[str | TraceSource] = (),
) -> Starlette:
    """The console for the outbox and inbox tables at ``url``, to be served on ``host``.

    Without ``token`` it is read-only and refuses any ``host`` but loopback. With one (at
    least 16 characters), every page needs a login with it; an operator may requeue or purge
    dead letters; every change needs the session's CSRF token and is audited with the
    operator's name. Requests must name ``host``, a loopback name or one of ``allowed_host``
    in their Host header. Reconciliation reports are served from ``reports_dir`` only.
    ``secure_cookie`` marks the session cookie Secure (a TLS proxy in front); with
    ``trusted_proxy`` (addresses or networks), such a proxy's X-Forwarded-Proto and
    X-Forwarded-For are believed. ``inboxes``: the inbox databases the message page
    (``/messages/{id}``) looks in besides ``url``, each ``NAME=URL``, a bare URL (named
    ``inbox1``, ``inbox2``... as ``outbox trace --inbox`` names them) or a TraceSource.
    Raises ConfigurationError for a token, host, directory or inbox that will not do.
    """
    console = Console.of(
        settings(
            url,
            token=token,
            schema=schema,
            sample_seconds=sample_seconds,
            host=host,
            allowed_host=allowed_host,
            reports_dir=reports_dir,
            secure_cookie=secure_cookie,
            trusted_proxy=trusted_proxy,
            pool_size=pool_size,
            inboxes=inboxes,
        )
    )
    app = Starlette(
        routes=routes(Path(__file__).parent / "static"),
        middleware=middleware(console.settings, console.pages),
        lifespan=_lifespan,
        exception_handlers={
            psycopg.Error: _database_error,
            OutboxError: _database_error,
            RecursionError: _too_deep,
        },
    )
    app.state.console = console
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    """The pool and the history's sampler, for as long as the app is served."""
    console: Console = app.state.console
    console.data.open()
    sampler = asyncio.create_task(console.history.run())
    try:
        yield
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await console.data.close()


async def _database_error(request: Request, exc: Exception) -> Response:
    """The page for a database that is missing its tables, refused a value, or is gone."""
    console = console_of(request)
    if isinstance(exc, psycopg.errors.UndefinedTable):
        message = (
            "the outbox-inbox tables are missing in this database: run `outbox migrate "
            "upgrade --url ...` against it"
        )
    elif isinstance(exc, psycopg.DataError):
        return console.pages.problem(
            request, 400, f"the database refused a value of the request: {exc}"
        )
    elif isinstance(exc, PoolTimeout):
        message = f"the database cannot be reached: {await console.data.why_unreachable()}"
    else:
        message = f"the database cannot be reached or refused the query: {redact(exc)}"
    return console.pages.problem(request, 503, message.splitlines()[0])


async def _too_deep(request: Request, exc: Exception) -> Response:
    return console_of(request).pages.problem(
        request, 400, "the message is nested too deeply to show"
    )
