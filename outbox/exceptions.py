"""The exception hierarchy of outbox-inbox.

Every error the library raises derives from :class:`OutboxError`. Each class's docstring is its
default message. Errors carry their data as attributes, and driver errors are chained with
``raise ... from exc`` so the original cause is never lost.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AmbiguousMessageError",
    "ConfigurationError",
    "InvalidMessageError",
    "MessageNotFoundError",
    "MissingDependencyError",
    "ObjectMissingError",
    "ObjectTooLargeError",
    "OutboxError",
    "PayloadTooLargeError",
    "SchemaNotInstalledError",
    "SerializationError",
    "TransactionRequiredError",
]


class OutboxError(Exception):
    """An outbox-inbox operation failed."""

    def __init__(self, message: str | None = None, **data: Any) -> None:
        self.message = message or (self.__doc__ or "").strip().splitlines()[0]
        self.data = data
        for name, value in data.items():
            setattr(self, name, value)
        super().__init__(self.message)


class ConfigurationError(OutboxError):
    """The configuration is invalid."""


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional dependency is not installed: install the extra the message names."""

    #: the missing module, and the package's extra that installs it
    module: str
    extra: str


class InvalidMessageError(OutboxError, ValueError):
    """The message is invalid and was not written."""


class SerializationError(InvalidMessageError, TypeError):
    """The payload or headers cannot be serialized to JSON; nothing was written."""


class PayloadTooLargeError(InvalidMessageError):
    """The serialized payload is larger than the configured maximum; nothing was written."""


class ObjectMissingError(InvalidMessageError):
    """The claim-checked object is not in the store (deleted, or never uploaded there)."""


class ObjectTooLargeError(InvalidMessageError):
    """The claim-checked object is larger than the consumer downloads."""


class TransactionRequiredError(OutboxError):
    """The connection is not in a transaction; writing now would break atomicity."""


class SchemaNotInstalledError(OutboxError):
    """The outbox tables do not exist: run `outbox migrate upgrade` (or `alembic upgrade heads`)."""


class MessageNotFoundError(OutboxError):
    """No message matches (``outbox trace``): it was never committed, or retention deleted it
    everywhere."""


class AmbiguousMessageError(OutboxError):
    """More than one message matches (``outbox trace``): look it up by id."""
