"""MQTT 5 adapter (paho-mqtt 2.x with its network thread): QoS 1 PUBACKs awaited per batch.

Envelope headers travel as MQTT 5 user properties, the content type as the ``content_type``
property, the body as the payload. QoS 1 by default; ``qos_by_topic`` gives QoS 0 to
at-most-once topics (sent once, nothing to await).

Threads: paho's network thread calls ``on_publish`` while holding paho's own lock, so the
callback only hands ``(mid, reason code)`` to the event loop with ``call_soon_threadsafe``. The
loop registers each message's future right after ``publish`` returns, before it can run the
hand-off, so an early PUBACK is never missed. Order: ``publish`` is called in input order and
paho sends queued messages in order (MQTT requires the broker to keep it per topic for QoS 1).

Outages: paho reconnects underneath, and it keeps every QoS 1 message it was given until it is
acknowledged, re-sending it after a reconnect. So nothing is handed to paho while it is not
connected: ``publish_batch`` raises BrokerUnreachableError instead (the relay releases the rows
without counting an attempt and pauses). A message whose PUBACK is lost with the connection
comes back as BrokerUnreachableError too; paho may still deliver its copy after the reconnect,
one extra copy at most, which the consumer's inbox drops. paho's queue is bounded
(``max_queued``); a message refused by a full queue is retryable.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from outbox.kit import require
from outbox.wire import mqtt as wire
from outbox.wire.cloudevents import CloudEvents
from relay.brokers._batch import (
    Batch,
    PublishError,
    check_size,
    permanent,
    retryable,
    unreachable,
)
from relay.brokers.base import DEFAULT_ACK_TIMEOUT, BrokerFeatures, Destinations, mqtt_topic_matches
from relay.exceptions import BrokerUnreachableError

__all__ = ["MqttPublisher"]

log = logging.getLogger("relay.brokers.mqtt")

MAX_PACKET = 268_435_455  # MQTT's largest remaining length
#: PUBACK reason codes worth retrying: unspecified error, packet id in use, quota exceeded
_RETRYABLE_CODES = {0x80, 0x91, 0x97}


class MqttPublisher:
    """Publishes to an MQTT 5 broker; QoS 1 (or 0 per topic)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        destinations: Mapping[str, str] | None = None,
        partitions: Mapping[str, int] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        qos: int = 1,
        qos_by_topic: Mapping[str, int] | None = None,
        username: str | None = None,
        password: str | None = None,
        client_id: str = "",
        tls: bool = False,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        connect_timeout: float = 5.0,
        max_in_flight: int = 1000,
        max_queued: int = 10_000,
        max_payload_bytes: int = MAX_PACKET - 65_536,
        cloudevents: CloudEvents | None = None,
    ) -> None:
        #: the CloudEvents format (outbox.wire.cloudevents), or None: our own
        self._cloudevents = cloudevents
        self._mqtt = require("paho.mqtt.client", "mqtt")
        for name, value in {"qos": qos, **dict(qos_by_topic or {})}.items():
            if value not in (0, 1):
                raise ConfigurationError(f"MQTT QoS for {name!r} must be 0 or 1, got {value!r}")
        self._host, self._port = host, port
        self._destination = Destinations(
            destinations, broker="mqtt", allow=allowed_destinations, matches=mqtt_topic_matches,
            partitions=partitions,
        )
        self._qos, self._qos_by_topic = qos, dict(qos_by_topic or {})
        self._auth = (username, password)
        self._client_id, self._tls = client_id, tls
        self._timeout, self._connect_timeout = timeout, connect_timeout
        self._max_in_flight = max_in_flight
        self._max_queued = max_queued
        self._client: Any = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._acks: deque[tuple[int, Any]] = deque()  # appended by paho's thread
        self._wake_scheduled = False
        self.features = BrokerFeatures(
            name="mqtt",
            dedup_window_seconds=0,
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=max_payload_bytes,
            ack_timeout_seconds=timeout,
        )

    async def start(self) -> None:
        if self._client is not None:
            return
        loop = asyncio.get_running_loop()
        connected: asyncio.Future[None] = loop.create_future()
        client = self._new_client(loop, connected)
        client.connect_async(self._host, self._port, keepalive=30, clean_start=True)
        client.loop_start()
        try:
            await asyncio.wait_for(connected, self._connect_timeout)
        except Exception as exc:
            await _shutdown(client)
            reason = "no CONNACK" if isinstance(exc, TimeoutError) else str(exc)
            raise BrokerUnreachableError(
                f"cannot connect to MQTT broker {self._host}:{self._port} within "
                f"{self._connect_timeout} s: {reason} (is the broker running and the URL right?)",
                host=self._host,
                port=self._port,
            ) from exc
        self._client = client

    def _new_client(self, loop: asyncio.AbstractEventLoop, connected: asyncio.Future[None]) -> Any:
        mqtt = self._mqtt
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=self._client_id, protocol=mqtt.MQTTv5
        )
        client.max_inflight_messages_set(self._max_in_flight)
        client.max_queued_messages_set(self._max_queued)
        # paho's reconnect delay doubles up to 120 s by default: after a long outage the relay
        # would wait that long for a broker that is back; probe as often as the relay does
        client.reconnect_delay_set(min_delay=1, max_delay=10)
        if self._auth[0] is not None:
            client.username_pw_set(*self._auth)
        if self._tls:
            client.tls_set()

        def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            loop.call_soon_threadsafe(_settle_connect, connected, reason)

        def on_publish(_c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
            # one loop wake-up per burst of PUBACKs, not one per message
            self._acks.append((mid, reason))
            if not self._wake_scheduled:
                self._wake_scheduled = True
                loop.call_soon_threadsafe(self._drain_acks)

        def on_disconnect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._lost, reason)

        client.on_connect, client.on_publish = on_connect, on_publish
        client.on_disconnect = on_disconnect
        return client

    def _drain_acks(self) -> None:
        self._wake_scheduled = False  # before draining: a later append schedules another
        while self._acks:
            self._acked(*self._acks.popleft())

    def _acked(self, mid: int, reason: Any) -> None:
        fut = self._pending.pop(mid, None)
        if fut is None or fut.done():
            return
        if reason.is_failure:
            fut.set_exception(_PubackError(int(reason.value), str(reason)))
        else:
            fut.set_result(None)

    def _lost(self, reason: Any) -> None:
        """The connection dropped: every unacked message is failed (and retried by the relay)."""
        self._drain_acks()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(_ConnectionLost(f"MQTT connection lost ({reason})"))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _shutdown(client)
        self._lost("publisher closed")

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        await self.start()
        client = self._client
        if not client.is_connected():
            # paho would queue the messages and send them after it reconnects, while the relay
            # sends them again: hand it nothing (the relay releases the rows and pauses)
            raise BrokerUnreachableError(
                f"not connected to the MQTT broker {self._host}:{self._port} (reconnecting)",
                host=self._host,
                port=self._port,
            )
        loop = asyncio.get_running_loop()
        batch = Batch(envelopes, self._destination)
        pending: dict[int, asyncio.Future[Any]] = {}
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            qos = self._qos_by_topic.get(env.topic, self._qos)
            err = check_size(env, dest, self.features.max_payload_bytes, "MQTT")
            if err is None:
                try:
                    message = wire.encode(env, self._cloudevents)
                    info = client.publish(dest, message.payload, qos, False, self._props(message))
                except ValueError as exc:  # wildcard or empty topic, bad QoS
                    err = permanent(f"invalid MQTT publish: {exc}", env, dest, exc)
                else:
                    err = self._track(i, env, dest, info, qos, pending, loop)
            if err is not None:
                batch.refuse(i, err)
        await batch.settle(
            pending,
            self._timeout,
            lambda i, exc: self._classify(envelopes[i], batch.destinations[i], exc),
            "PUBACK",
        )
        if not client.is_connected():
            batch.connection_lost(list(pending), "MQTT connection lost")
        return batch.results

    def _track(
        self,
        i: int,
        env: Envelope,
        dest: str,
        info: Any,
        qos: int,
        pending: dict[int, asyncio.Future[Any]],
        loop: asyncio.AbstractEventLoop,
    ) -> PublishError | None:
        rc = info.rc
        if rc == self._mqtt.MQTT_ERR_NO_CONN and qos > 0:
            # The connection dropped since the check in publish_batch. paho keeps a QoS 1
            # message and sends it after reconnecting: it is in flight, not refused. Its
            # future fails with the connection (_lost), so the relay releases it uncounted.
            rc = self._mqtt.MQTT_ERR_SUCCESS
        if rc != self._mqtt.MQTT_ERR_SUCCESS:
            reason = self._mqtt.error_string(rc)
            return retryable(f"MQTT publish not queued: {reason}", env, dest)
        if qos > 0:
            fut: asyncio.Future[Any] = loop.create_future()
            self._pending[info.mid] = pending[i] = fut
        return None

    def _props(self, message: wire.MqttMessage) -> Any:
        properties = require("paho.mqtt.properties", "mqtt")
        packettypes = require("paho.mqtt.packettypes", "mqtt")
        props = properties.Properties(packettypes.PacketTypes.PUBLISH)
        props.UserProperty = message.user_properties
        props.ContentType = message.content_type
        return props

    def _classify(self, env: Envelope, dest: str, exc: BaseException) -> PublishError:
        if isinstance(exc, _ConnectionLost):
            return unreachable(str(exc), env, dest, exc)
        if isinstance(exc, _PubackError) and exc.code not in _RETRYABLE_CODES:
            return permanent(f"broker refused the message: {exc}", env, dest, exc)
        return retryable(f"{type(exc).__name__}: {exc}", env, dest, exc)


class _ConnectionLost(ConnectionError):
    pass


class _PubackError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"PUBACK reason code 0x{code:02x} ({text})")
        self.code = code


def _settle_connect(fut: asyncio.Future[None], reason: Any) -> None:
    if fut.done():
        return
    if reason.is_failure:
        fut.set_exception(ConnectionError(f"CONNACK refused: {reason}"))
    else:
        fut.set_result(None)


async def _shutdown(client: Any) -> None:
    """Disconnect and stop paho's network thread (joined off the event loop)."""
    client.disconnect()
    await asyncio.to_thread(client.loop_stop)
