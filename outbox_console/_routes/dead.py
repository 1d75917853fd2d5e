"""The outbox's dead letters: the listing (``/dead``), one message (``/dead/{id}``), and
requeue or purge (``/dead/change``: one message, its key, or what the listing's filter shows)."""

from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from outbox.exceptions import OutboxError
from outbox_console._data import CHANGE_LIMIT, LIST_LIMIT, OUTBOX_DEAD
from outbox_console._render import payload_text
from outbox_console._routes.changes import change
from outbox_console._routes.forms import dead_filter, message_ids, require_all
from outbox_console._state import console_of
from relay.admin import DeadFilter

__all__ = ["routes"]


async def listing(request: Request) -> Response:
    console = console_of(request)
    try:
        where, error = dead_filter(request.query_params)
    except OutboxError as exc:
        return console.pages.problem(request, 400, str(exc))
    messages = await console.data.dead_letters(where, error, LIST_LIMIT)
    return console.pages.render(
        request, "dead.html", messages=messages, filters=request.query_params
    )


async def message(request: Request) -> Response:
    console = console_of(request)
    try:
        message_id = uuid.UUID(request.path_params["id"])
    except ValueError:
        return console.pages.problem(request, 404, "no such message id")
    found = await console.data.dead_message(message_id)
    if found is None:
        return console.pages.problem(
            request, 404, f"message {message_id} is not dead (or no longer exists)"
        )
    payload = payload_text(found.payload)
    return console.pages.render(request, "message.html", m=found, payload=payload)


async def changed(request: Request) -> Response:
    form = await request.form()

    async def select() -> DeadFilter | None:
        scope = form.get("scope")
        if scope == "one":
            return DeadFilter(ids=message_ids(form.get("id")))
        if scope == "key":
            return DeadFilter(topic=str(form.get("topic")), key=str(form.get("key")))
        filters, error = dead_filter(form)  # what the listing shows, error text included
        if filters.empty and not error:
            require_all(form)
        rows = await console_of(request).data.dead_letters(filters, error, CHANGE_LIMIT)
        return DeadFilter(ids=[r["id"] for r in rows]) if rows else None

    return await change(request, form, select, OUTBOX_DEAD, "/dead")


routes = [
    Route("/dead", listing),
    Route("/dead/change", changed, methods=["POST"]),
    Route("/dead/{id}", message),
]
