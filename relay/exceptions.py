"""The relay's branch of the exception hierarchy."""

from __future__ import annotations

from outbox.exceptions import ConfigurationError, OutboxError

__all__ = [
    "BrokerUnreachableError",
    "CaptureLeaseLostError",
    "DestinationRefusedError",
    "DestinationUnavailableError",
    "NotSentError",
    "PermanentPublishError",
    "RelayError",
    "RelayIdInUseError",
    "ReplayError",
    "RetryablePublishError",
]


class RelayError(OutboxError):
    """The relay failed."""


class CaptureLeaseLostError(RelayError):
    """This relay no longer holds the lease on the replication slot (its heartbeat lapsed, or
    a standby took the slot over): it records and confirms nothing more, and stands by."""


class RetryablePublishError(RelayError):
    """The broker did not confirm the message; it will be retried with backoff."""


class PermanentPublishError(RelayError):
    """The broker refused the message for good (too large, unroutable, rejected); dead-lettered."""


class NotSentError(RetryablePublishError):
    """Not sent: an earlier message of its key failed in this batch; released, no attempt counted.

    An adapter returns it for a message it held back without handing it to the broker, so the
    relay gives the row back untried instead of charging it an attempt it never had.
    """


class BrokerUnreachableError(RetryablePublishError):
    """The broker is unreachable (not connected); released untried, claiming pauses.

    An adapter raises it from ``publish_batch`` when it knows it is disconnected before
    sending anything, and returns it for a message whose acknowledgement was lost with the
    connection. The relay gives such rows back without counting an attempt, so an outage
    never dead-letters anything, and pauses claiming with backoff.
    """


class DestinationUnavailableError(RetryablePublishError):
    """The broker is up, but this message's destination refuses it for now: no JetStream
    stream for the subject, a RabbitMQ exchange that does not exist, a Kafka topic unknown or
    not authorized, a Redis key that is not a stream or not permitted. A configuration to fix,
    not the message's fault and not an outage: the row is released untried (no attempt
    counted, nothing dead-lettered), its topic is paused with backoff, and every other topic
    keeps flowing. ``outbox status`` and the metrics show the paused topic and the reason.
    """


class DestinationRefusedError(DestinationUnavailableError):
    """The relay will not send this topic: it is not a name (the topic grammar of
    outbox/_topic.py; a row inserted directly or by an older writer), or the destination its
    default mapping gives is the broker's own (``$JS.API...``, ``$SYS/...``) or outside the
    operator's allowed destinations. Nothing is sent; like any unavailable destination, the
    row is released untried and only its topic pauses, with this one-line reason."""


class RelayIdInUseError(ConfigurationError):
    """Another live relay process uses this relay id; give every relay its own id."""


class ReplayError(OutboxError):
    """The replay stopped; the cursor keeps what the broker confirmed: run it again."""
