"""The pages: Jinja2 templates (``templates/``), with what every page shows in its header."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from outbox.kit import redact
from outbox.trace import gap
from outbox_console._security import csrf_token, may_read

__all__ = ["PAYLOAD_SHOWN", "Pages", "ago", "gap", "payload_text"]

#: the most of a payload the message page shows (the rest is counted, not sent)
PAYLOAD_SHOWN = 64 * 1024


def ago(seconds: float | None) -> str:
    """A duration as the pages show it: ``42 s``, ``3 min 5 s``, ``2 h 10 min``, ``1 d 4 h``."""
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


def payload_text(payload: bytes) -> str:
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


def _finalize(value: Any) -> Any:
    """What ``{{ value }}`` prints: text masked (markup stays markup)."""
    if not isinstance(value, str) or not value:
        return value
    masked = redact(value)
    if masked == value:
        return value
    # markup already (a template's own): masking replaces a secret, it adds no markup
    return Markup(masked) if isinstance(value, Markup) else masked  # noqa: S704


class Pages:
    """Renders the console's pages for the database at ``url`` (named, password masked, to
    whoever may read) and a console with or without ``token``."""

    def __init__(self, url: str, token: str | None) -> None:
        self._url, self._token = url, token
        self._templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
        self._templates.env.filters["ago"] = ago
        self._templates.env.filters["gap"] = gap
        self._templates.env.filters["redact"] = lambda text: redact(text) if text else ""
        # Every value a page prints passes the redactor (a last_error, a relay's broker, an
        # audit reason, a header): no field can show a secret the process knows or a URL's.
        self._templates.env.finalize = _finalize

    def render(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> Response:
        """The template ``name`` with ``context`` and the header's: who, where, the notice."""
        context.update(
            writable=self._token is not None,
            operator=request.session.get("operator"),
            csrf=csrf_token(request),
            database=redact(self._url) if may_read(request, self._token) else "",
            notice=request.session.pop("notice", None),
        )
        return self._templates.TemplateResponse(request, name, context, status_code=status_code)

    def problem(self, request: Request, status_code: int, message: str) -> Response:
        """The error page: ``message`` says what went wrong and what to do."""
        return self.render(request, "error.html", status_code, message=message)
