"""``outbox trace``: one message's journey across the outbox database and the inbox databases.

:func:`trace_message` reads, in read-only transactions, the message's outbox row, its key's
neighbours, the relays, the latest reconciliation run that judged it, and every named inbox
database's records of it, and returns a :class:`Journey`: frozen dataclasses only, which
:func:`render_text` writes for a terminal and :meth:`Journey.as_dict` as JSON;
:func:`load_trace_sources` reads where to look from a reconciliation job file. The console's
message page and ``outbox trace`` are built on these (docs/how-to/find-a-message.md).

Nothing here writes: the console's role is enough, or the relay's role on the outbox database
and a consumer's role on its inbox database (``outbox migrate grants``). The parts, each in a
module of its own: where to look (``_config``), what is found (``_model``), reading
(``_read``), judging it (``_advice``), and the terminal's text (``_render``).
"""

from __future__ import annotations

from outbox.exceptions import AmbiguousMessageError, MessageNotFoundError
from outbox.trace._config import TraceSource, TraceSources, load_trace_sources
from outbox.trace._model import (
    Action,
    InboxRecord,
    Journey,
    KeyNeighbour,
    OutboxRecord,
    ReconciliationVerdict,
    RelaySeen,
    Step,
)
from outbox.trace._read import trace_message
from outbox.trace._render import gap, render_text

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
    "gap",
    "load_trace_sources",
    "render_text",
    "trace_message",
]
