"""The inbox's held keys: the listing (``/held``), and retry or give up (``/held/change``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inbox.admin import HeldFilter
from outbox_console._data import INBOX_HELD
from outbox_console._routes.changes import change
from outbox_console._routes.forms import message_ids
from outbox_console._state import console_of

__all__ = ["routes"]


async def listing(request: Request) -> Response:
    console = console_of(request)
    q = request.query_params
    where = HeldFilter(
        consumer=q.get("consumer") or None,
        topic=q.get("topic") or None,
        key=q.get("key") or None,
    )
    keys = await console.data.held_keys(where)
    return console.pages.render(request, "held.html", keys=keys, filters=q)


async def changed(request: Request) -> Response:
    form = await request.form()

    async def select() -> HeldFilter:
        chosen = HeldFilter(
            consumer=str(form.get("consumer") or "") or None,
            topic=str(form.get("topic") or "") or None,
            key=str(form.get("key") or "") or None,
            ids=message_ids(form.get("id")) if form.get("scope") == "one" else (),
        )
        if chosen.empty and form.get("all") != "1":
            raise ValueError(
                "say which held keys: a consumer, topic, key or message id (or \u201call\u201d)"
            )
        return chosen

    return await change(request, form, select, INBOX_HELD, "/held")


routes = [
    Route("/held", listing),
    Route("/held/change", changed, methods=["POST"]),
]
