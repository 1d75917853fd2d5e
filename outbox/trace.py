"""``outbox trace``: one message's journey across the outbox database and the inbox databases.

:func:`trace_message` returns a :class:`Journey` (frozen dataclasses only), which
:func:`render_text` writes for a terminal and :meth:`Journey.as_dict` as JSON;
:func:`load_trace_sources` reads where to look from a TOML file. The console's message page
and ``outbox trace`` are built on these. docs/how-to/find-a-message.md has the settings.
"""

from __future__ import annotations

from outbox._journey import (
    Action,
    AmbiguousMessageError,
    InboxRecord,
    Journey,
    KeyNeighbour,
    MessageNotFoundError,
    OutboxRecord,
    ReconciliationVerdict,
    RelaySeen,
    Step,
    TraceSource,
    TraceSources,
    load_trace_sources,
    render_text,
    trace_message,
)

__all__ = [
    "Action",
    "AmbiguousMessageError",
    "InboxRecord",
    "Journey",
    "KeyNeighbour",
    "MessageNotFoundError",
    "OutboxRecord",
    "ReconciliationVerdict",
    "RelaySeen",
    "Step",
    "TraceSource",
    "TraceSources",
    "load_trace_sources",
    "render_text",
    "trace_message",
]
