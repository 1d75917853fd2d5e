"""The audit (``/audit``): who requeued or purged what, and why."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from outbox_console._state import console_of

__all__ = ["routes"]


async def audit(request: Request) -> Response:
    console = console_of(request)
    return console.pages.render(request, "audit.html", **await console.data.audit())


routes = [Route("/audit", audit)]
