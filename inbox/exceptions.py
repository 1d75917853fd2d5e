"""The inbox branch of the exception hierarchy (all derive from :class:`outbox.OutboxError`).

A duplicate delivery is never an exception: :func:`inbox.receive` returns ``False``. These
errors mean the message was *not* processed and must be delivered again.
"""

from __future__ import annotations

from outbox.exceptions import OutboxError

__all__ = [
    "ClaimCheckStoreError",
    "ConcurrentDeliveryError",
    "InboxError",
    "OutOfOrderError",
    "PartitionLostError",
]


class InboxError(OutboxError):
    """An inbox operation failed; the message was not processed and must be redelivered."""

    #: True when delivering the same message again may succeed without any change.
    retryable: bool = False


class ConcurrentDeliveryError(InboxError):
    """Another transaction handled the same message or key concurrently: roll back and retry."""

    retryable = True


class OutOfOrderError(InboxError):
    """The message is ahead of its key's next sequence number: roll back and redeliver later."""

    retryable = True


class ClaimCheckStoreError(InboxError):
    """The claim check's object store could not be asked (network, permissions): the message
    waits and is tried again."""

    retryable = True


class PartitionLostError(ConcurrentDeliveryError):
    """This process no longer holds the lease of the message's partition (another process
    took it over, or its lease lapsed while the process was frozen or cut off): the
    transaction is rolled back, nothing is applied, and the partition's new owner gets the
    message."""
