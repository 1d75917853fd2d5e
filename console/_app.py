"""The console's web application (Starlette, Jinja2 templates, Chart.js; every asset packaged).

Every page reads; every change goes through the functions behind the CLI (``outbox dead retry``
and ``purge``, ``outbox inbox dead retry`` and ``purge``), which write the audit row in the
same transaction as the change and wake the relays.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

import inbox._dead as inbox_dead
from console._history import History
from console._security import Forbidden, check_change, csrf_token, log_in, logged_in
from console._statements import console_statements
from outbox._redact import redact
from outbox.exceptions import OutboxError
from relay._admin import DeadFilter, audit_log, dead_list, dead_purge, dead_retry, relay_status

__all__ = ["create_app"]

HERE = Path(__file__).parent
#: how many rows a listing shows, and how many messages one change may touch
LIST_LIMIT = 200
CHANGE_LIMIT = 10_000

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
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(payload)} bytes, not UTF-8) " + payload[:2048].hex(" ")
    with contextlib.suppress(ValueError):
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    return text


def create_app(
    url: str,
    *,
    token: str | None = None,
    schema: str | None = None,
    sample_seconds: float = 10.0,
) -> Starlette:
    """The console for the outbox and inbox tables at ``url``.

    Without ``token`` it is read-only. With one, an operator logs in with it and may requeue or
    purge dead letters; every change needs the session's CSRF token and is audited with the
    operator's name.
    """
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["ago"] = _ago
    history = History(url, schema, sample_seconds)
    stmts = console_statements(schema)

    def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        context.update(
            writable=token is not None,
            operator=request.session.get("operator"),
            csrf=csrf_token(request),
            database=redact(url),
            notice=request.session.pop("notice", None),
        )
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    async def read(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def _query(sql: bytes, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(sql, params or {})
            names = [d.name for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    async def overview(request: Request) -> Response:
        status = await read(relay_status, url, schema=schema)
        consumers = await read(_query, stmts.consumers)
        held = await read(inbox_dead.held_keys, url, limit=LIST_LIMIT, schema=schema)
        runs = await read(_query, stmts.runs, {"limit": 5})
        held_by_consumer: dict[str, int] = {}
        for k in held:
            held_by_consumer[k.consumer] = held_by_consumer.get(k.consumer, 0) + 1
        return render(
            request,
            "overview.html",
            status=status,
            consumers=consumers,
            held=held_by_consumer,
            runs=runs,
        )

    async def history_api(request: Request) -> Response:
        return JSONResponse(history.series())

    def _dead_filter(params: Any) -> tuple[DeadFilter, str]:
        older = params.get("older_than_minutes") or ""
        until = None
        if older:
            try:
                until = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=float(older))
            except ValueError as exc:
                raise OutboxError(f"older than: {older!r} is not a number of minutes") from exc
        where = DeadFilter(
            topic=params.get("topic") or None, key=params.get("key") or None, until=until
        )
        return where, str(params.get("error") or "")

    def _matching(where: DeadFilter, error: str, limit: int) -> list[Any]:
        found = dead_list(url, where, limit=limit, schema=schema)
        return [m for m in found if error.lower() in (m.last_error or "").lower()]

    async def dead(request: Request) -> Response:
        try:
            where, error = _dead_filter(request.query_params)
        except OutboxError as exc:
            return render(request, "error.html", 400, message=str(exc))
        messages = await read(_matching, where, error, LIST_LIMIT)
        return render(request, "dead.html", messages=messages, filters=request.query_params)

    async def dead_message(request: Request) -> Response:
        try:
            message_id = uuid.UUID(request.path_params["id"])
        except ValueError:
            return render(request, "error.html", 404, message="no such message id")
        found = await read(dead_list, url, DeadFilter(ids=[message_id]), limit=1, schema=schema)
        if not found:
            return render(
                request,
                "error.html",
                404,
                message=f"message {message_id} is not dead (or no longer exists)",
            )
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
            return render(request, "error.html", 403, message=str(exc))
        action = str(form.get("action", ""))
        if action not in ("retry", "purge"):
            return render(request, "error.html", 400, message="action must be retry or purge")
        reason = str(form.get("reason") or "").strip() or None
        if reason is None:
            return render(
                request, "error.html", 400, message="say why (a reason is kept in the audit)"
            )
        dry_run = form.get("dry_run") == "1"
        try:
            selected = await where()
            changed: list[uuid.UUID] = []
            if selected is not None:
                changed = await read(
                    retry if action == "retry" else purge,
                    url,
                    selected,
                    actor=f"{operator} (console)",
                    reason=reason,
                    limit=CHANGE_LIMIT,
                    dry_run=dry_run,
                    schema=schema,
                )
        except psycopg.errors.InsufficientPrivilege as exc:
            return render(
                request,
                "error.html",
                403,
                message=(
                    "the console's database role may not change dead letters "
                    f"({exc.diag.message_primary}): run it with the relay's role "
                    "(outbox migrate grants) to requeue or purge"
                ),
            )
        except (OutboxError, ValueError) as exc:  # a malformed id or filter in the form
            return render(request, "error.html", 400, message=str(exc))
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

    def _message_ids(raw: object) -> list[uuid.UUID]:
        try:
            return [uuid.UUID(str(raw))]
        except ValueError as exc:
            raise ValueError(f"{raw!r} is not a message id") from exc

    async def dead_change(request: Request) -> Response:
        form = await request.form()

        async def where() -> DeadFilter | None:
            scope = form.get("scope")
            if scope == "one":
                return DeadFilter(ids=_message_ids(form.get("id")))
            if scope == "key":
                return DeadFilter(topic=str(form.get("topic")), key=str(form.get("key")))
            filters, error = _dead_filter(form)  # what the listing shows, error text included
            ids = [m.id for m in await read(_matching, filters, error, CHANGE_LIMIT)]
            return DeadFilter(ids=ids) if ids else None

        return await change(request, form, where, dead_retry, dead_purge, "/dead")

    async def held(request: Request) -> Response:
        q = request.query_params
        where = inbox_dead.HeldFilter(
            consumer=q.get("consumer") or None,
            topic=q.get("topic") or None,
            key=q.get("key") or None,
        )
        keys = await read(inbox_dead.held_keys, url, where, limit=LIST_LIMIT, schema=schema)
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
            if chosen.empty:
                raise ValueError("say which held keys: a consumer, topic, key or message id")
            return chosen

        return await change(
            request, form, where, inbox_dead.dead_retry, inbox_dead.dead_purge, "/held"
        )

    async def audit(request: Request) -> Response:
        outbox_rows = await read(audit_log, url, limit=LIST_LIMIT, schema=schema)
        inbox_rows = await read(inbox_dead.dead_audit, url, limit=LIST_LIMIT, schema=schema)
        return render(request, "audit.html", outbox_rows=outbox_rows, inbox_rows=inbox_rows)

    async def run_report(request: Request) -> Response:
        try:
            run_id = uuid.UUID(request.path_params["run_id"])
        except ValueError:
            return render(request, "error.html", 404, message="no such run")
        rows = await read(_query, stmts.run_report, {"run_id": run_id})
        path = Path(rows[0]["report"]) if rows and rows[0]["report"] else None
        if path is None or not path.is_file():
            return render(
                request,
                "error.html",
                404,
                message=(
                    f"the report of run {run_id} is not on this machine"
                    + (f" ({path})" if path else "")
                ),
            )
        return FileResponse(path, media_type="text/html")

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return render(request, "login.html")
        form = await request.form()
        if str(form.get("csrf", "")) != request.session.get("csrf"):
            return render(request, "error.html", 403, message="stale login form: reload it")
        operator = str(form.get("operator") or "").strip()
        if not operator:
            return render(request, "login.html", 400, problem="give your name (for the audit)")
        if not log_in(request, token, str(form.get("token", "")), operator):
            return render(request, "login.html", 403, problem="wrong token")
        return RedirectResponse("/", status_code=303)

    async def logout(request: Request) -> Response:
        form = await request.form()
        if logged_in(request) and str(form.get("csrf", "")) == request.session.get("csrf"):
            request.session.clear()
        return RedirectResponse("/", status_code=303)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.create_task(history.run())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    async def headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.update(_SECURITY_HEADERS)
        return response

    async def database_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, psycopg.errors.UndefinedTable):
            message = (
                "the outbox-inbox tables are missing in this database: run `outbox migrate "
                "upgrade --url ...` against it"
            )
        else:
            message = f"the database cannot be reached or refused the query: {redact(exc)}"
        return render(request, "error.html", 503, message=message.splitlines()[0])

    from starlette.middleware.base import BaseHTTPMiddleware

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
        middleware=[
            Middleware(
                SessionMiddleware,
                secret_key=secrets.token_urlsafe(32),
                session_cookie="outbox_console",
                same_site="strict",
                https_only=False,
                max_age=8 * 3600,
            ),
            Middleware(BaseHTTPMiddleware, dispatch=headers),
        ],
        lifespan=lifespan,
        exception_handlers={psycopg.Error: database_error, OutboxError: database_error},
    )
    app.state.history = history
    return app
