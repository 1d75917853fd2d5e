"""The overview (``/``): topics, relays, consumers, reconciliation runs; and the history its
charts draw (``/api/history``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from outbox_console._state import console_of

__all__ = ["routes"]


async def overview(request: Request) -> Response:
    console = console_of(request)
    return console.pages.render(request, "overview.html", **await console.data.overview())


async def history(request: Request) -> Response:
    return JSONResponse(console_of(request).history.series())


routes = [
    Route("/", overview),
    Route("/api/history", history),
]
