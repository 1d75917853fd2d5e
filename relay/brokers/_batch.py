"""What every adapter's ``publish_batch`` shares: per-key blocking and bounded ack waits.

Per-key order within a batch: envelopes are handed to the broker client in input order over one
connection, so the broker sees one key's messages in order. When a message fails *before* it was
handed over (too large, invalid destination), the later messages of the same ``(topic, key)`` in
the batch are not sent at all: they come back as NotSentError (a RetryablePublishError that the
relay releases without counting an attempt), so message n+1 never reaches the broker in a batch
where message n was refused. A failure only known after sending (a nack, a timeout) cannot
un-send the later messages already in flight; the relay retries the failed one and the
consumer's inbox order guard discards what arrives out of order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outbox.envelope import Envelope
from outbox.kit import partition_for
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationRefusedError,
    DestinationUnavailableError,
    NotSentError,
    PermanentPublishError,
    RetryablePublishError,
)

__all__ = ["Batch", "check_size", "permanent", "retryable", "unavailable", "unreachable"]

PublishError = RetryablePublishError | PermanentPublishError


def retryable(
    reason: str,
    env: Envelope,
    destination: str,
    cause: BaseException | None = None,
    *,
    kind: type[RetryablePublishError] = RetryablePublishError,
) -> RetryablePublishError:
    """A RetryablePublishError (or ``kind``) naming the message, its destination and the cause."""
    exc = kind(
        f"message {env.id} to {destination!r}: {reason}",
        message_id=env.id,
        destination=destination,
        reason=reason,
    )
    exc.__cause__ = cause
    return exc


def unreachable(
    reason: str, env: Envelope, destination: str, cause: BaseException | None = None
) -> RetryablePublishError:
    """A BrokerUnreachableError for a message lost with the connection (released, not counted)."""
    return retryable(reason, env, destination, cause, kind=BrokerUnreachableError)


def unavailable(
    reason: str, env: Envelope, destination: str, cause: BaseException | None = None
) -> RetryablePublishError:
    """A DestinationUnavailableError: this destination refuses messages until an operator fixes
    its configuration (released untried; the relay pauses that topic only). ``reason`` should
    say what to fix."""
    return retryable(reason, env, destination, cause, kind=DestinationUnavailableError)


def permanent(
    reason: str, env: Envelope, destination: str, cause: BaseException | None = None
) -> PermanentPublishError:
    """A PermanentPublishError naming the message, its destination and the cause."""
    exc = PermanentPublishError(
        f"message {env.id} to {destination!r}: {reason}",
        message_id=env.id,
        destination=destination,
        reason=reason,
    )
    exc.__cause__ = cause
    return exc


def check_size(env: Envelope, destination: str, limit: int, broker: str) -> PublishError | None:
    """PermanentPublishError when the body is larger than ``limit`` bytes (0: no limit)."""
    if limit and len(env.payload) > limit:
        return permanent(
            f"payload of {len(env.payload)} bytes exceeds the {broker} limit of {limit} bytes",
            env,
            destination,
        )
    return None


class Batch:
    """The outcomes of one ``publish_batch`` call, one per envelope, in input order."""

    def __init__(
        self, envelopes: Sequence[Envelope], destination: Callable[[str, str], str]
    ) -> None:
        """``destination(topic, key)``: the broker destination of a message (a
        :class:`~relay.brokers.base.Destinations`; a topic split into partitions has one
        destination per partition, chosen by the key)."""
        self.envelopes = envelopes
        counts = getattr(destination, "partitions_of", None)
        # a batch has few topics (and partitions): resolve each once
        by_place: dict[tuple[str, int], str] = {}
        split: dict[str, int | None] = {}
        refused: dict[str, DestinationRefusedError] = {}
        self.destinations = []
        for e in envelopes:
            count = split.get(e.topic, 0)
            if count == 0:
                count = split[e.topic] = counts(e.topic) if counts is not None else None
            place = (e.topic, -1 if count is None else partition_for(e.key, count))
            dest = by_place.get(place)
            if dest is None and e.topic not in refused:
                try:
                    dest = by_place[place] = destination(e.topic, e.key)
                except DestinationRefusedError as exc:
                    # The rare path: a topic the relay will not send (not a name, or a
                    # destination the operator's configuration does not allow). Its messages
                    # are refused before anything is sent; skip_if_blocked() keeps every
                    # adapter from sending them.
                    refused[e.topic] = exc
            self.destinations.append(dest or e.topic)
        self.results: list[BaseException | None] = [None] * len(envelopes)
        self._blocked: dict[tuple[str, str], Envelope] = {}
        for i, e in enumerate(envelopes):
            refusal = refused.get(e.topic)
            if refusal is not None:
                reason = getattr(refusal, "reason", str(refusal))
                dest = getattr(refusal, "destination", None) or e.topic
                self.refuse(i, unavailable(reason, e, dest, refusal))

    def items(self) -> list[tuple[int, Envelope, str]]:
        return [(i, e, self.destinations[i]) for i, e in enumerate(self.envelopes)]

    @property
    def blocking(self) -> bool:
        """Some key of the batch is held back (a cheap test before ``skip_if_blocked``)."""
        return bool(self._blocked)

    def skip_if_blocked(self, i: int) -> bool:
        """True (and record why) when an earlier message of this key failed before sending."""
        env = self.envelopes[i]
        earlier = self._blocked.get((env.topic, env.key))
        if earlier is None:
            return False
        if earlier is env:  # refused before sending: its result is its own refusal
            return True
        self.results[i] = retryable(
            f"not sent: message {earlier.id} of key {env.key!r} before it in this batch failed",
            env,
            self.destinations[i],
            kind=NotSentError,
        )
        return True

    def refuse(self, i: int, exc: BaseException) -> None:
        """Message ``i`` failed before it was sent: later messages of its key are held back."""
        env = self.envelopes[i]
        self.results[i] = exc
        self._blocked.setdefault((env.topic, env.key), env)

    def connection_lost(self, indices: Sequence[int], reason: str) -> None:
        """The connection dropped before these sent messages were acknowledged.

        Their retryable results become BrokerUnreachableError: the relay releases them without
        counting an attempt and pauses (the broker, not the messages, failed).
        """
        for i in indices:
            result = self.results[i]
            if isinstance(result, RetryablePublishError) and not isinstance(
                result, BrokerUnreachableError | NotSentError
            ):
                why = getattr(result, "reason", result)
                env, dest = self.envelopes[i], self.destinations[i]
                self.results[i] = unreachable(f"{reason} ({why})", env, dest, result)

    def fail_all(self, indices: Sequence[int], make: Callable[[int], BaseException]) -> None:
        for i in indices:
            self.results[i] = make(i)

    async def settle(
        self,
        pending: Mapping[int, asyncio.Future[Any]],
        timeout: float,  # noqa: ASYNC109 - a deadline for the acks, not for the call
        classify: Callable[[int, BaseException], BaseException],
        what: str = "acknowledgement",
    ) -> None:
        """Wait (at most ``timeout`` s) for the broker's ack of each sent message."""
        if not pending:
            return
        _, not_done = await asyncio.wait(pending.values(), timeout=timeout)
        for i, fut in pending.items():
            env, dest = self.envelopes[i], self.destinations[i]
            if fut in not_done:
                fut.cancel()
                self.results[i] = retryable(
                    f"no {what} from the broker within {timeout} s", env, dest
                )
            elif fut.cancelled():
                self.results[i] = retryable(f"{what} cancelled (connection lost?)", env, dest)
            elif (exc := fut.exception()) is not None:
                self.results[i] = classify(i, exc)
        if not_done:
            # let the cancelled futures/tasks finish their cancellation before returning
            await asyncio.gather(*not_done, return_exceptions=True)
