"""outbox: write messages in your own PostgreSQL transaction; the relay delivers them.

Commit and the message will be delivered; roll back and it never existed::

    from outbox import publish
    with Session(engine) as session, session.begin():
        session.add(order)
        publish(session, topic="orders", key=str(order.id), payload={"order_id": order.id})
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from outbox._connections import AsyncTarget, Target
from outbox._ids import id_from_idempotency_key, new_message_id
from outbox._message import DEFAULT_MAX_PAYLOAD_BYTES, Message
from outbox._partition import partition_for
from outbox._publish import publish, publish_async, publish_batch, publish_batch_async
from outbox._statements import WAKEUP_CHANNEL
from outbox.envelope import Envelope
from outbox.exceptions import (
    AmbiguousMessageError,
    ConfigurationError,
    InvalidMessageError,
    MessageNotFoundError,
    OutboxError,
    PayloadTooLargeError,
    SchemaNotInstalledError,
    SerializationError,
    TransactionRequiredError,
)
from outbox.schema import include_object, make_metadata, metadata
from outbox.trace import Journey, TraceSource, TraceSources, trace_message

try:  # the version lives in pyproject.toml only; this reads what was installed
    __version__ = _version("outbox-inbox")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "WAKEUP_CHANNEL",
    "AmbiguousMessageError",
    "AsyncTarget",
    "ConfigurationError",
    "Envelope",
    "InvalidMessageError",
    "Journey",
    "Message",
    "MessageNotFoundError",
    "OutboxError",
    "PayloadTooLargeError",
    "SchemaNotInstalledError",
    "SerializationError",
    "Target",
    "TraceSource",
    "TraceSources",
    "TransactionRequiredError",
    "id_from_idempotency_key",
    "include_object",
    "make_metadata",
    "metadata",
    "new_message_id",
    "partition_for",
    "publish",
    "publish_async",
    "publish_batch",
    "publish_batch_async",
    "trace_message",
]
