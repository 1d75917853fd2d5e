"""A change of dead letters or held keys: who asks, what, why; a dry run shows what it would
do. The change itself goes through the CLI's audited functions (``_data.Decisions``)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from outbox.exceptions import OutboxError
from outbox_console._data import Decisions
from outbox_console._security import Forbidden, check_change
from outbox_console._state import console_of

__all__ = ["change"]


@dataclass(frozen=True)
class _Asked:
    operator: str
    action: Literal["retry", "purge"]
    reason: str
    dry_run: bool


def _asked(request: Request, form: Any) -> _Asked | Response:
    """What the form asks and who asks it, or the page that refuses it."""
    console = console_of(request)
    try:
        operator = check_change(request, console.settings.token, form)
    except Forbidden as exc:
        return console.pages.problem(request, 403, str(exc))
    action = str(form.get("action", ""))
    if action not in ("retry", "purge"):
        return console.pages.problem(request, 400, "action must be retry or purge")
    reason = str(form.get("reason") or "").strip()
    if not reason:
        return console.pages.problem(request, 400, "say why (a reason is kept in the audit)")
    return _Asked(
        operator=operator,
        action="retry" if action == "retry" else "purge",
        reason=reason,
        dry_run=form.get("dry_run") == "1",
    )


async def change(
    request: Request,
    form: Any,
    select: Callable[[], Awaitable[Any]],
    decisions: Decisions,
    back: str,
) -> Response:
    """Requeue or purge what ``select()`` selects (a filter, or None: nothing matches) through
    ``decisions``; then back to ``back`` with a notice, or (a dry run) the preview page."""
    console = console_of(request)
    asked = _asked(request, form)
    if isinstance(asked, Response):
        return asked
    try:
        selected = await select()
        changed: list[uuid.UUID] = []
        if selected is not None:
            changed = await console.data.change(
                decisions,
                asked.action,
                selected,
                actor=f"{asked.operator} (console)",
                reason=asked.reason,
                dry_run=asked.dry_run,
            )
    except psycopg.errors.InsufficientPrivilege as exc:
        return console.pages.problem(
            request,
            403,
            "the console's database role may not change dead letters "
            f"({exc.diag.message_primary}): grant it the console's privileges "
            "(outbox migrate grants --console ROLE) to requeue or purge",
        )
    except (OutboxError, ValueError) as exc:  # a malformed id or filter in the form
        return console.pages.problem(request, 400, str(exc))
    if asked.dry_run:
        return console.pages.render(
            request,
            "preview.html",
            action=asked.action,
            ids=changed,
            reason=asked.reason,
            form=form,
            back=back,
        )
    verb = "requeued" if asked.action == "retry" else "purged"
    request.session["notice"] = f"{len(changed)} message(s) {verb} by {asked.operator}"
    return RedirectResponse(back, status_code=303)
