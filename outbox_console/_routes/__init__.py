"""The console's routes, one module per page (and its changes)."""

from __future__ import annotations

from pathlib import Path

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from outbox_console._routes import audit, dead, held, login, messages, overview, reports

__all__ = ["routes"]


def routes(static: Path) -> list[BaseRoute]:
    """Every route of the console; the assets in ``static`` under ``/static``."""
    return [
        *overview.routes,
        *dead.routes,
        *held.routes,
        *messages.routes,
        *audit.routes,
        *reports.routes,
        *login.routes,
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
