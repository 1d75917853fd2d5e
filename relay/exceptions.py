"""The relay's branch of the exception hierarchy."""

from __future__ import annotations

from outbox.exceptions import OutboxError

__all__ = ["PermanentPublishError", "RelayError", "RetryablePublishError"]


class RelayError(OutboxError):
    """The relay failed."""


class RetryablePublishError(RelayError):
    """The broker did not confirm the message; it will be retried with backoff."""


class PermanentPublishError(RelayError):
    """The broker refused the message for good (too large, unroutable, rejected); dead-lettered."""
