"""The console's web application (Starlette, Jinja2 templates, Chart.js; every asset packaged).

Every page reads; every change goes through the functions behind the CLI (``outbox dead retry``
and ``purge``, ``outbox inbox dead retry`` and ``purge``), which write the audit row in the
same transaction as the change and wake the relays. Who may see and change what:
``outbox/console/_security.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import math
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

import inbox._dead as inbox_dead
from outbox._redact import redact
from outbox.console._history import History
from outbox.console._security import (
    Forbidden,
    LoginThrottle,
    allowed_hosts,
    check_change,
    check_listen,
    check_token,
    csrf_token,
    is_remote,
    log_in,
    logged_in,
)
from outbox.console._statements import console_statements
from outbox.exceptions import ConfigurationError, OutboxError
from relay._admin import DeadFilter, audit_log, dead_list, dead_purge, dead_retry, relay_status

__all__ = ["create_app"]

log = logging.getLogger("outbox.console")

HERE = Path(__file__).parent
#: how many rows a listing shows, and how many messages one change may touch
LIST_LIMIT = 200
CHANGE_LIMIT = 10_000
#: the most of a payload the message page shows (the rest is counted, not sent)
PAYLOAD_SHOWN = 64 * 1024
#: the oldest "older than" filter (ten years, in minutes)
MAX_MINUTES = 10 * 365 * 24 * 60
#: the largest form a change or a login may post
MAX_FORM_BYTES = 64 * 1024
#: the longest operator name (it goes into every audit row)
MAX_OPERATOR = 100
#: how long a request waits for a pooled connection before the page says the database is gone
POOL_WAIT = 5.0

_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
    return f"{seconds // 86400:.0f} d {seconds % 86400 // 3600:.0f} h"


def _payload_text(payload: bytes) -> str:
    """The payload as the message page shows it: JSON indented, text as it is, else hex; the
    first :data:`PAYLOAD_SHOWN` bytes only, and JSON nested too deeply to indent as text."""
    if len(payload) > PAYLOAD_SHOWN:
        head = payload[:PAYLOAD_SHOWN].decode("utf-8", errors="replace")
        return f"(the first {PAYLOAD_SHOWN} of {len(payload)} bytes)\n{head}"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(payload)} bytes, not UTF-8) " + payload[:2048].hex(" ")
    with contextlib.suppress(ValueError, RecursionError):
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    return text


def _minutes(text: str) -> float:
    """``older than`` in minutes: a finite number from 0 to :data:`MAX_MINUTES`."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_MINUTES:
        raise OutboxError(
            f"older than: {text[:40]!r} is not a number of minutes from 0 to {MAX_MINUTES} "
            "(ten years)"
        )
    return value


def _dead_filter(params: Any) -> tuple[DeadFilter, str]:
    """The dead-letter filter of a listing's query or a change's form, and its error text."""
    older = str(params.get("older_than_minutes") or "").strip()
    until = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=_minutes(older)) if older else None
    where = DeadFilter(
        topic=params.get("topic") or None, key=params.get("key") or None, until=until
    )
    return where, str(params.get("error") or "")


def _message_ids(raw: object) -> list[uuid.UUID]:
    try:
        return [uuid.UUID(str(raw))]
    except ValueError as exc:
        raise ValueError(f"{str(raw)[:40]!r} is not a message id") from exc


def _rows(cur: psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    names = [d.name for d in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


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


def _reports_root(reports_dir: str | Path | None) -> Path | None:
    if reports_dir is None:
        return None
    root = Path(reports_dir).resolve()
    if not root.is_dir():
        raise ConfigurationError(
            f"the reports directory {str(reports_dir)!r} is not a directory: pass the directory "
            "the reconciliation writes its runs into (--output-dir of `outbox reconcile`)",
            setting="reports_dir",
        )
    return root


def _report_file(root: Path, named: str) -> Path | None:
    """The report file ``named`` (a run's row) if it resolves, symlinks followed, to a file
    inside ``root``; None otherwise."""
    try:
        path = (root / named).resolve(strict=True)
    except (OSError, ValueError, RuntimeError):  # missing, a NUL byte, a symlink loop
        return None
    return path if path.is_relative_to(root) and path.is_file() else None


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
) -> Starlette:
    """The console for the outbox and inbox tables at ``url``, to be served on ``host``.

    Without ``token`` it is read-only and refuses any ``host`` but loopback. With one (at
    least 16 characters), every page needs a login with it; an operator may requeue or purge
    dead letters; every change needs the session's CSRF token and is audited with the
    operator's name. Requests must name ``host``, a loopback name or one of ``allowed_host``
    in their Host header. Reconciliation reports are served from ``reports_dir`` only.
    ``secure_cookie`` marks the session cookie Secure (a TLS proxy in front); with
    ``trusted_proxy`` (addresses or networks), such a proxy's X-Forwarded-Proto and
    X-Forwarded-For are believed. Raises ConfigurationError for a token, host or directory
    that will not do.
    """
    check_token(token)
    check_listen(host, token)
    reports = _reports_root(reports_dir)
    hosts = allowed_hosts(host, allowed_host)
    proxies = [p.strip() for p in trusted_proxy if p.strip()]
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["ago"] = _ago
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=max(1, pool_size),
        open=False,
        timeout=POOL_WAIT,
        check=ConnectionPool.check_connection,
        kwargs={"autocommit": True, "application_name": "outbox console"},
        name="outbox-console",
    )
    history = History(pool.connection, schema, sample_seconds)
    stmts = console_statements(schema)
    throttle = LoginThrottle()

    def may_read(request: Request) -> bool:
        return token is None or logged_in(request)

    def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        context.update(
            writable=token is not None,
            operator=request.session.get("operator"),
            csrf=csrf_token(request),
            database=redact(url) if may_read(request) else "",
            notice=request.session.pop("notice", None),
        )
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    def problem(request: Request, status_code: int, message: str) -> Response:
        return render(request, "error.html", status_code, message=message)

    async def read(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(conn, *args, **kwargs)`` in a worker thread, on a connection of the pool."""

        def call() -> Any:
            with pool.connection() as conn:
                return fn(conn, *args, **kwargs)

        return await asyncio.to_thread(call)

    def _query(
        conn: psycopg.Connection[Any], sql: bytes, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        return _rows(conn.execute(sql, params or {}))

    def _overview(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        held_by_consumer: dict[str, int] = {}
        for k in inbox_dead.held_keys(conn, limit=LIST_LIMIT, schema=schema):
            held_by_consumer[k.consumer] = held_by_consumer.get(k.consumer, 0) + 1
        return {
            "status": relay_status(conn, schema=schema),
            "consumers": _query(conn, stmts.consumers),
            "held": held_by_consumer,
            "runs": _query(conn, stmts.runs, {"limit": 5}),
        }

    async def overview(request: Request) -> Response:
        return render(request, "overview.html", **await read(_overview))

    async def history_api(request: Request) -> Response:
        return JSONResponse(history.series())

    def _listing(
        conn: psycopg.Connection[Any], where: DeadFilter, error: str, limit: int
    ) -> list[dict[str, Any]]:
        """What the dead-letter listing shows (no payloads): see console_dead_listing."""
        return _query(conn, stmts.dead_listing, {**where.params(), "error": error, "limit": limit})

    async def dead(request: Request) -> Response:
        try:
            where, error = _dead_filter(request.query_params)
        except OutboxError as exc:
            return problem(request, 400, str(exc))
        messages = await read(_listing, where, error, LIST_LIMIT)
        return render(request, "dead.html", messages=messages, filters=request.query_params)

    async def dead_message(request: Request) -> Response:
        try:
            message_id = uuid.UUID(request.path_params["id"])
        except ValueError:
            return problem(request, 404, "no such message id")
        found = await read(dead_list, DeadFilter(ids=[message_id]), limit=1, schema=schema)
        if not found:
            return problem(request, 404, f"message {message_id} is not dead (or no longer exists)")
        message = found[0]
        return render(request, "message.html", m=message, payload=_payload_text(message.payload))

    async def change(
        request: Request,
        form: Any,
        where: Callable[[], Awaitable[Any]],
        retry: Callable[..., list[uuid.UUID]],
        purge: Callable[..., list[uuid.UUID]],
        back: str,
    ) -> Response:
        """Requeue or purge what ``where()`` selects (a filter, or None: nothing matches),
        through ``retry`` or ``purge``: the CLI's audited functions."""
        try:
            operator = check_change(request, token, form)
        except Forbidden as exc:
            return problem(request, 403, str(exc))
        action = str(form.get("action", ""))
        if action not in ("retry", "purge"):
            return problem(request, 400, "action must be retry or purge")
        reason = str(form.get("reason") or "").strip() or None
        if reason is None:
            return problem(request, 400, "say why (a reason is kept in the audit)")
        dry_run = form.get("dry_run") == "1"
        try:
            selected = await where()
            changed: list[uuid.UUID] = []
            if selected is not None:
                changed = await read(
                    retry if action == "retry" else purge,
                    selected,
                    actor=f"{operator} (console)",
                    reason=reason,
                    limit=CHANGE_LIMIT,
                    dry_run=dry_run,
                    schema=schema,
                )
        except psycopg.errors.InsufficientPrivilege as exc:
            return problem(
                request,
                403,
                "the console's database role may not change dead letters "
                f"({exc.diag.message_primary}): grant it the console's privileges "
                "(outbox migrate grants --console ROLE) to requeue or purge",
            )
        except (OutboxError, ValueError) as exc:  # a malformed id or filter in the form
            return problem(request, 400, str(exc))
        if dry_run:
            return render(
                request,
                "preview.html",
                action=action,
                ids=changed,
                reason=reason,
                form=form,
                back=back,
            )
        verb = "requeued" if action == "retry" else "purged"
        request.session["notice"] = f"{len(changed)} message(s) {verb} by {operator}"
        return RedirectResponse(back, status_code=303)

    def _everything(form: Any) -> None:
        """A change without a filter needs the form's explicit "all" (the CLI's --all)."""
        if form.get("all") != "1":
            raise ValueError(
                "no filter: this would change every dead letter (up to "
                f"{CHANGE_LIMIT:,}); narrow it, or tick \u201call\u201d to mean every one"
            )

    async def dead_change(request: Request) -> Response:
        form = await request.form()

        async def where() -> DeadFilter | None:
            scope = form.get("scope")
            if scope == "one":
                return DeadFilter(ids=_message_ids(form.get("id")))
            if scope == "key":
                return DeadFilter(topic=str(form.get("topic")), key=str(form.get("key")))
            filters, error = _dead_filter(form)  # what the listing shows, error text included
            if filters.empty and not error:
                _everything(form)
            rows = await read(_listing, filters, error, CHANGE_LIMIT)
            return DeadFilter(ids=[r["id"] for r in rows]) if rows else None

        return await change(request, form, where, dead_retry, dead_purge, "/dead")

    async def held(request: Request) -> Response:
        q = request.query_params
        where = inbox_dead.HeldFilter(
            consumer=q.get("consumer") or None,
            topic=q.get("topic") or None,
            key=q.get("key") or None,
        )
        keys = await read(inbox_dead.held_keys, where, limit=LIST_LIMIT, schema=schema)
        return render(request, "held.html", keys=keys, filters=q)

    async def held_change(request: Request) -> Response:
        form = await request.form()

        async def where() -> inbox_dead.HeldFilter:
            chosen = inbox_dead.HeldFilter(
                consumer=str(form.get("consumer") or "") or None,
                topic=str(form.get("topic") or "") or None,
                key=str(form.get("key") or "") or None,
                ids=_message_ids(form.get("id")) if form.get("scope") == "one" else (),
            )
            if chosen.empty and form.get("all") != "1":
                raise ValueError(
                    "say which held keys: a consumer, topic, key or message id (or \u201call\u201d)"
                )
            return chosen

        return await change(
            request, form, where, inbox_dead.dead_retry, inbox_dead.dead_purge, "/held"
        )

    def _audit(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        return {
            "outbox_rows": audit_log(conn, limit=LIST_LIMIT, schema=schema),
            "inbox_rows": inbox_dead.dead_audit(conn, limit=LIST_LIMIT, schema=schema),
        }

    async def audit(request: Request) -> Response:
        return render(request, "audit.html", **await read(_audit))

    async def run_report(request: Request) -> Response:
        try:
            run_id = uuid.UUID(request.path_params["run_id"])
        except ValueError:
            return problem(request, 404, "no such run")
        if reports is None:
            return problem(
                request,
                404,
                "this console serves no reports: start it with --reports-dir (the directory "
                "the reconciliation writes its runs into)",
            )
        rows = await read(_query, stmts.run_report, {"run_id": run_id})
        named = str(rows[0]["report"]) if rows and rows[0]["report"] else None
        path = _report_file(reports, named) if named else None
        if path is None:
            if named:
                log.warning(
                    "console: the report of run %s (%r) is not a file inside %s: not served",
                    run_id,
                    named[:300],
                    reports,
                )
            return problem(
                request,
                404,
                f"the report of run {run_id} is not in the console's reports directory",
            )
        return FileResponse(path, media_type="text/html")

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return render(request, "login.html")
        client = request.client.host if request.client else "unknown"
        wait = throttle.retry_after(client)
        if wait:
            answer = render(
                request,
                "login.html",
                429,
                problem=f"too many failed logins from your address: try again in {wait} s",
            )
            answer.headers["Retry-After"] = str(wait)
            return answer
        form = await request.form()
        if str(form.get("csrf", "")) != request.session.get("csrf"):
            return problem(request, 403, "stale login form: reload it")
        operator = str(form.get("operator") or "").strip()
        if not operator or len(operator) > MAX_OPERATOR or not operator.isprintable():
            return render(
                request,
                "login.html",
                400,
                problem=f"give your name (for the audit; at most {MAX_OPERATOR} characters)",
            )
        if not log_in(request, token, str(form.get("token", "")), operator):
            failures = throttle.failed(client)
            log.warning(
                "console: failed login from %s as %r (%d within %.0f s)",
                client,
                operator,
                failures,
                throttle.window,
            )
            return render(request, "login.html", 403, problem="wrong token")
        throttle.succeeded(client)
        log.info("console: %r logged in from %s", operator, client)
        return RedirectResponse("/", status_code=303)

    async def logout(request: Request) -> Response:
        form = await request.form()
        if logged_in(request) and str(form.get("csrf", "")) == request.session.get("csrf"):
            request.session.clear()
        return RedirectResponse("/", status_code=303)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        pool.open(wait=False)  # an unreachable database is a page that says so, not no console
        sampler = asyncio.create_task(history.run())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await asyncio.to_thread(pool.close)

    async def headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.update(_SECURITY_HEADERS)
        return response

    async def gate(request: Request, call_next: Any) -> Response:
        """With a token, nothing but the login page and the assets without a session; no
        form larger than :data:`MAX_FORM_BYTES`."""
        path = request.url.path
        if request.method == "POST":
            length = request.headers.get("content-length", "")
            if not length.isdigit() or int(length) > MAX_FORM_BYTES:
                return problem(request, 413, f"a form of at most {MAX_FORM_BYTES} bytes")
        if may_read(request) or path == "/login" or path.startswith("/static/"):
            response: Response = await call_next(request)
            return response
        if request.method in ("GET", "HEAD"):
            return RedirectResponse("/login", status_code=303)
        return problem(request, 403, "log in with the console's token first")

    async def database_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, psycopg.errors.UndefinedTable):
            message = (
                "the outbox-inbox tables are missing in this database: run `outbox migrate "
                "upgrade --url ...` against it"
            )
        elif isinstance(exc, psycopg.DataError):
            return problem(request, 400, f"the database refused a value of the request: {exc}")
        elif isinstance(exc, PoolTimeout):
            message = f"the database cannot be reached: {await asyncio.to_thread(_why, url)}"
        else:
            message = f"the database cannot be reached or refused the query: {redact(exc)}"
        return problem(request, 503, message.splitlines()[0])

    async def too_deep(request: Request, exc: Exception) -> Response:
        return problem(request, 400, "the message is nested too deeply to show")

    middleware = [Middleware(BaseHTTPMiddleware, dispatch=headers)]
    if proxies:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        middleware.insert(0, Middleware(ProxyHeadersMiddleware, trusted_hosts=proxies))
    middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False))
    if token is None:
        middleware.append(Middleware(_LoopbackClientsOnly))
    middleware += [
        Middleware(_Sessions, secure=secure_cookie),
        Middleware(BaseHTTPMiddleware, dispatch=gate),
    ]
    app = Starlette(
        routes=[
            Route("/", overview),
            Route("/api/history", history_api),
            Route("/dead", dead),
            Route("/dead/change", dead_change, methods=["POST"]),
            Route("/dead/{id}", dead_message),
            Route("/held", held),
            Route("/held/change", held_change, methods=["POST"]),
            Route("/audit", audit),
            Route("/runs/{run_id}/report", run_report),
            Route("/login", login, methods=["GET", "POST"]),
            Route("/logout", logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            psycopg.Error: database_error,
            OutboxError: database_error,
            RecursionError: too_deep,
        },
    )
    app.state.history = history
    app.state.pool = pool
    return app


def _why(url: str) -> str:
    """Why no pooled connection came: one direct attempt, for its error (the pool's own
    attempts only log theirs)."""
    try:
        with psycopg.connect(url, connect_timeout=3):
            return "no connection became free in time"
    except psycopg.Error as exc:
        text = redact(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
