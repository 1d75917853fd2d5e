"""One message's journey (``/messages/{id}``): what ``outbox trace`` shows, for the console's
database and the inbox databases it was given; and the look-up (``/messages``) by id, by
idempotency key and topic, or by topic, key and seq. Read-only: the commands it suggests are
text to copy, never run."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from outbox.exceptions import ConfigurationError
from outbox.kit import redact
from outbox.trace import AmbiguousMessageError, MessageNotFoundError
from outbox_console._state import console_of

__all__ = ["MAX_FIELD", "routes"]

#: the longest topic, key or idempotency key a look-up accepts
MAX_FIELD = 1024
#: the largest seq there is (a bigint)
MAX_SEQ = 2**63 - 1
_FIELDS = ("id", "topic", "key", "seq", "idempotency_key")


class BadLookup(ValueError):
    """A look-up that names no message: the text says what to give instead."""


def _message_id(text: str) -> uuid.UUID:
    try:
        if len(text) > 64:
            raise ValueError
        return uuid.UUID(text.strip())
    except ValueError:
        shown = text[:40] + ("..." if len(text) > 40 else "")
        raise BadLookup(
            f"{shown!r} is not a message id: give a UUID such as "
            "0190f3a2-7c1e-7d3b-9a57-0b0c5e11e7a1, or look it up by topic, key and seq, or by "
            "idempotency key and topic"
        ) from None


def _lookup(params: QueryParams) -> dict[str, Any]:
    """The look-up's fields, checked: trace_message's keyword arguments."""
    given = {f: params.get(f, "").strip() for f in _FIELDS}
    for name, value in given.items():
        if len(value) > MAX_FIELD:
            raise BadLookup(f"{name} is {len(value)} characters long: at most {MAX_FIELD}")
    out: dict[str, Any] = {k: v for k, v in given.items() if v and k != "seq"}
    if given["seq"]:
        seq = given["seq"]
        if not seq.isascii() or not seq.isdigit() or not 1 <= int(seq) <= MAX_SEQ:
            raise BadLookup(f"seq {seq[:40]!r} is not a number from 1 to {MAX_SEQ}")
        out["seq"] = int(seq)
    return out


async def find(request: Request) -> Response:
    """The look-up form; with an id, that message's page; with other fields, the message they
    name."""
    console = console_of(request)
    try:
        lookup = _lookup(request.query_params)
        if "id" in lookup:
            if set(lookup) != {"id"}:
                raise BadLookup("give an id alone, or leave it empty and give the other fields")
            return RedirectResponse(f"/messages/{_message_id(lookup['id'])}", status_code=303)
    except BadLookup as exc:
        return console.pages.problem(request, 400, str(exc))
    if not lookup:
        return console.pages.render(request, "find.html")
    return await _journey_page(request, None, lookup)


async def message(request: Request) -> Response:
    """One message's journey."""
    try:
        message_id = _message_id(request.path_params["id"])
    except BadLookup as exc:
        return console_of(request).pages.problem(request, 400, str(exc))
    return await _journey_page(request, message_id, {})


async def _journey_page(
    request: Request, message_id: uuid.UUID | None, lookup: dict[str, Any]
) -> Response:
    console = console_of(request)
    try:
        journey = await console.data.trace(message_id, **lookup)
    except ConfigurationError as exc:
        return console.pages.problem(request, 400, str(exc))
    except MessageNotFoundError as exc:
        return console.pages.problem(request, 404, str(exc))
    except AmbiguousMessageError as exc:
        return console.pages.problem(request, 409, str(exc))
    inboxes = [(s.name, redact(s.url)) for s in console.data.sources.inboxes]
    return console.pages.render(request, "journey.html", j=journey, inboxes=inboxes)


routes = [
    Route("/messages", find),
    Route("/messages/{id}", message),
]
