"""What the console's routes share: its settings, data access, pages, history and throttle."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from outbox_console._data import ConsoleData
from outbox_console._history import History
from outbox_console._render import Pages
from outbox_console._security import LoginThrottle, SessionStore
from outbox_console._settings import Settings

__all__ = ["Console", "console_of"]


@dataclass
class Console:
    """One console app's parts (``app.state.console``)."""

    settings: Settings
    data: ConsoleData
    pages: Pages
    history: History
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    sessions: SessionStore = field(default_factory=SessionStore)

    @classmethod
    def of(cls, settings: Settings) -> Console:
        data = ConsoleData(
            settings.url, settings.schema, settings.pool_size, settings.inboxes, settings.reports
        )
        return cls(
            settings=settings,
            data=data,
            pages=Pages(settings.url, settings.token),
            history=History(data.connection, settings.schema, settings.sample_seconds),
        )


def console_of(request: Request) -> Console:
    """The console that serves ``request``."""
    console: Console = request.app.state.console
    return console
