"""Message ids: UUIDv7 by default, or derived from an idempotency key."""

from __future__ import annotations

import uuid

import uuid_utils.compat

__all__ = ["IDEMPOTENCY_NAMESPACE", "id_from_idempotency_key", "new_message_id"]

#: Fixed namespace for ids derived from idempotency keys. Changing it would change every
#: derived id, so it is part of the wire contract.
IDEMPOTENCY_NAMESPACE = uuid.UUID("5b1f6d0e-8f6b-4c8e-9a57-0b0c5e11e7a1")


def new_message_id() -> uuid.UUID:
    """A fresh, time-ordered UUIDv7 (a stdlib ``uuid.UUID``)."""
    value: uuid.UUID = uuid_utils.compat.uuid7()
    return value


def id_from_idempotency_key(topic: str, idempotency_key: str) -> uuid.UUID:
    """The id a message with this idempotency key on this topic always gets (UUIDv5).

    A producer that restarts and redoes its work re-creates the same id, so the second
    publish is a no-op and every inbox downstream recognises the message.
    """
    return uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{topic}\x00{idempotency_key}")
