"""RabbitMQ adapter (aio-pika): publisher confirms, persistent, ``message_id``, ``mandatory``.

Destination ``exchange/routing_key`` (split at the first ``/``); without a ``/`` the default
exchange ``""`` and the destination as routing key (the queue of that name).

Order: one channel; each publish is a task created in input order, and aiormq writes the frames
of a channel under a FIFO lock taken before the first suspension, so the broker receives them in
input order. The broker confirms each (ack, nack, or return + ack for an unroutable message).

Unroutable (``mandatory=True`` and ``basic.return``) is a PermanentPublishError. A missing
exchange would close the channel and fail every message in flight, so named exchanges are
checked first on a throw-away channel and messages to a missing one are refused before sending.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.envelope import Envelope
from outbox.kit import redact, require
from outbox.wire import rabbitmq as wire
from outbox.wire.cloudevents import CloudEvents
from relay.brokers._batch import (
    Batch,
    PublishError,
    check_size,
    permanent,
    retryable,
    unavailable,
)
from relay.brokers.base import DEFAULT_ACK_TIMEOUT, BrokerFeatures, Destinations
from relay.exceptions import RetryablePublishError

__all__ = ["RabbitMQPublisher"]

log = logging.getLogger("relay.brokers.rabbitmq")


class _SaidByTheAdapter(logging.Filter):
    """aiormq logs a failed connection attempt at ERROR; the adapter raises it as one line of
    its own (BrokerUnreachableError), so that record is dropped rather than said twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("error when creating transport")


logging.getLogger("aiormq.connection").addFilter(_SaidByTheAdapter())

DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024  # RabbitMQ's max_message_size default (3.8+)


def split_destination(destination: str) -> tuple[str, str]:
    """``"exchange/routing.key"`` -> ``("exchange", "routing.key")``; no ``/``: default exchange."""
    exchange, sep, routing_key = destination.partition("/")
    return (exchange, routing_key) if sep else ("", destination)


class RabbitMQPublisher:
    """Publishes to RabbitMQ with publisher confirms on one channel."""

    def __init__(
        self,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        *,
        destinations: Mapping[str, str] | None = None,
        partitions: Mapping[str, int] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        connect_timeout: float = 5.0,
        max_payload_bytes: int = DEFAULT_MAX_MESSAGE_SIZE,
        persistent: bool = True,
        cloudevents: CloudEvents | None = None,
    ) -> None:
        #: the CloudEvents format (outbox.wire.cloudevents), or None: our own
        self._cloudevents = cloudevents
        self._aio_pika = require("aio_pika", "rabbitmq")
        self._url = url
        self._destination = Destinations(
            destinations, broker="rabbitmq", allow=allowed_destinations,
            partitions=partitions,
        )
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._persistent = persistent
        self._conn: Any = None
        self._channel: Any = None
        self._exchanges: dict[str, Any] = {}
        self.features = BrokerFeatures(
            name="rabbitmq",
            dedup_window_seconds=0,
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=max_payload_bytes,
            ack_timeout_seconds=timeout,
        )

    async def start(self) -> None:
        if self._conn is None or self._conn.is_closed:
            try:
                self._conn = await self._aio_pika.connect(self._url, timeout=self._connect_timeout)
            except Exception as exc:
                self._conn = None
                raise RetryablePublishError(
                    f"cannot connect to RabbitMQ at {redact(self._url)}: "
                    f"{type(exc).__name__}: {redact(exc)} (is the server running and the URL "
                    "right?)",
                    url=redact(self._url),
                ) from exc
        if self._channel is None or self._channel.is_closed:
            self._exchanges = {}
            self._channel = await self._conn.channel(publisher_confirms=True, on_return_raises=True)

    async def close(self) -> None:
        conn, self._conn, self._channel, self._exchanges = self._conn, None, None, {}
        if conn is not None and not conn.is_closed:
            await conn.close()

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        try:
            await self.start()
        except RetryablePublishError:
            raise
        except Exception as exc:
            raise RetryablePublishError(f"cannot open a RabbitMQ channel: {exc}") from exc
        batch = Batch(envelopes, self._destination)
        missing = await self._missing_exchanges(
            {
                split_destination(d)[0]
                for d, r in zip(batch.destinations, batch.results, strict=True)
                if r is None  # not refused before sending
            }
        )
        pending: dict[int, asyncio.Future[Any]] = {}
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            exchange, routing_key = split_destination(dest)
            err = self._refusal(env, dest, exchange, routing_key, missing)
            if err is not None:
                batch.refuse(i, err)
                continue
            coro = self._exchanges[exchange].publish(
                self._message(env), routing_key, mandatory=True, timeout=self._timeout
            )
            pending[i] = asyncio.ensure_future(coro)  # tasks start in creation order
        await batch.settle(
            pending,
            self._timeout + 1,
            lambda i, exc: self._classify(envelopes[i], batch.destinations[i], exc),
            "publisher confirm",
        )
        return batch.results

    def _message(self, env: Envelope) -> Any:
        mode = self._aio_pika.DeliveryMode
        message = wire.encode(env, self._cloudevents)
        return self._aio_pika.Message(
            message.body,
            message_id=message.message_id,
            content_type=message.content_type,
            headers=message.headers,
            delivery_mode=mode.PERSISTENT if self._persistent else mode.NOT_PERSISTENT,
        )

    def _refusal(
        self, env: Envelope, dest: str, exchange: str, routing_key: str, missing: set[str]
    ) -> PublishError | None:
        if exchange in missing:  # a configuration to fix: the topic waits, nothing dead
            return unavailable(
                f"RabbitMQ exchange {exchange!r} does not exist: declare it, or map the topic "
                "to an existing exchange (destinations)",
                env,
                dest,
            )
        if len(routing_key.encode()) > 255:
            return permanent("routing key longer than 255 bytes", env, dest)
        return check_size(env, dest, self.features.max_payload_bytes, "RabbitMQ max_message_size")

    async def check_destination(self, destination: str) -> str:
        """Whether ``destination``'s exchange exists (``outbox relay check``; publishes
        nothing); the default exchange's routing key must name a queue."""
        from relay.exceptions import DestinationUnavailableError

        await self.start()
        exchange, slash, key = destination.partition("/")
        if not slash:
            exchange, key = "", destination
        probe = await self._conn.channel(publisher_confirms=False)
        try:
            if exchange:
                await probe.get_exchange(exchange, ensure=True)
                return f"exchange {exchange}, routing key {key}"
            await probe.declare_queue(key, passive=True)
            return f"queue {key} (default exchange)"
        except self._aio_pika.exceptions.ChannelNotFoundEntity:
            what = f"exchange {exchange!r}" if exchange else f"queue {key!r}"
            raise DestinationUnavailableError(f"{what} does not exist on RabbitMQ") from None
        finally:
            if not probe.is_closed:
                await probe.close()

    async def _missing_exchanges(self, names: set[str]) -> set[str]:
        """Look up exchanges not seen yet; a failed passive declare closes only the probe."""
        missing: set[str] = set()
        if "" not in self._exchanges:
            self._exchanges[""] = self._channel.default_exchange
        for name in names - self._exchanges.keys():
            probe = await self._conn.channel(publisher_confirms=False)
            try:
                await probe.get_exchange(name, ensure=True)
                self._exchanges[name] = await self._channel.get_exchange(name, ensure=False)
            except self._aio_pika.exceptions.ChannelNotFoundEntity:
                missing.add(name)
            finally:
                if not probe.is_closed:
                    await probe.close()
        return missing

    def _classify(self, env: Envelope, dest: str, exc: BaseException) -> PublishError:
        exceptions = self._aio_pika.exceptions
        if isinstance(exc, exceptions.PublishError):
            return permanent(
                "unroutable: no queue is bound for this exchange/routing key (mandatory=True)",
                env,
                dest,
                exc,
            )
        if isinstance(exc, exceptions.DeliveryError):
            return retryable("the broker nacked the message", env, dest, exc)
        if isinstance(exc, TimeoutError):
            return retryable(f"no publisher confirm within {self._timeout} s", env, dest, exc)
        return retryable(f"{type(exc).__name__}: {exc}", env, dest, exc)
