"""What a listing's query or a change's form asks for, read and checked."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

from outbox.exceptions import OutboxError
from outbox_console._data import CHANGE_LIMIT
from relay.admin import DeadFilter

__all__ = ["MAX_MINUTES", "dead_filter", "message_ids", "minutes", "require_all"]

#: the oldest "older than" filter (ten years, in minutes)
MAX_MINUTES = 10 * 365 * 24 * 60


def minutes(text: str) -> float:
    """``older than`` in minutes: a finite number from 0 to :data:`MAX_MINUTES`."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_MINUTES:
        raise OutboxError(
            f"older than: {text[:40]!r} is not a number of minutes from 0 to {MAX_MINUTES} "
            "(ten years)"
        )
    return value


def dead_filter(params: Any) -> tuple[DeadFilter, str]:
    """The dead-letter filter of a listing's query or a change's form, and its error text."""
    older = str(params.get("older_than_minutes") or "").strip()
    span = minutes(older) if older else 0.0
    # "older than 0 minutes" selects every dead letter: no filter, so a change needs "all"
    until = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=span) if span > 0 else None
    where = DeadFilter(
        topic=params.get("topic") or None, key=params.get("key") or None, until=until
    )
    return where, str(params.get("error") or "")


def message_ids(raw: object) -> list[uuid.UUID]:
    """The one message id a form names, or ValueError."""
    try:
        return [uuid.UUID(str(raw))]
    except ValueError as exc:
        raise ValueError(f"{str(raw)[:40]!r} is not a message id") from exc


def require_all(form: Any) -> None:
    """A change without a filter needs the form's explicit "all" (the CLI's --all)."""
    if form.get("all") != "1":
        raise ValueError(
            "no filter: this would change every dead letter (up to "
            f"{CHANGE_LIMIT:,}); narrow it, or tick \u201call\u201d to mean every one"
        )
