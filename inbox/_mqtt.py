"""MQTT 5 QoS 1 subscriber (paho-mqtt, manual acks): PUBACK only after the commit.

MQTT has no negative acknowledgement: a failed or out-of-order message is retried locally after
``redeliver_delay`` and, if the process dies first, redelivered by the broker when the
persistent session (same ``client_id``, ``clean_start=False``) reconnects.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Unpack

from inbox._consumer import BrokerConsumer, ConsumerOptions, Delivery
from inbox._runner import AsyncHandlerRunner, Result
from outbox.envelope import shown
from outbox.exceptions import ConfigurationError
from outbox.kit import require
from outbox.wire import mqtt as wire

__all__ = ["MqttConsumer"]


class MqttConsumer(BrokerConsumer):
    """Subscribe to ``topic`` at QoS 1 in a persistent session named ``client_id``."""

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        topic: str,
        client_id: str,
        host: str = "127.0.0.1",
        port: int = 1883,
        session_expiry: int = 86_400,
        connect_timeout: float = 10.0,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        require("paho.mqtt.client", "mqtt")  # fail at construction, naming the extra
        super().__init__(runner, **options)
        if not client_id:
            raise ConfigurationError("client_id is required: it names the persistent session")
        self.topic, self.client_id, self.host, self.port = topic, client_id, host, port
        self.session_expiry, self.connect_timeout = session_expiry, connect_timeout
        #: the broker sends at most this many unacknowledged messages (MQTT 5's receive
        #: maximum, the local buffer's bound): a few whole transaction batches per worker
        self.receive_maximum = 4 * self.batching.size * self.batching.workers + 16

    def _client(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> Any:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            manual_ack=True,
        )

        def on_connect(c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            if not reason.is_failure:
                c.subscribe(self.topic, qos=1)

        def on_subscribe(_c: Any, _u: Any, _m: Any, _r: Any, _p: Any) -> None:
            loop.call_soon_threadsafe(self.ready.set)

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, msg)

        client.on_connect, client.on_subscribe = on_connect, on_subscribe
        client.on_message = on_message
        return client

    async def _consume(self) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        client = self._client(loop, queue)
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self.session_expiry
        props.ReceiveMaximum = self.receive_maximum
        await loop.run_in_executor(
            None,
            lambda: client.connect(self.host, self.port, clean_start=False, properties=props),
        )
        client.loop_start()
        try:
            await asyncio.wait_for(self.ready.wait(), self.connect_timeout)
            while not self.stopping:
                try:
                    msg = await asyncio.wait_for(queue.get(), 0.5)
                except TimeoutError:
                    continue
                await self._one(client, queue, msg)
        finally:
            await self._finish_workers()
            client.disconnect()
            await loop.run_in_executor(None, client.loop_stop)

    async def _one(self, client: Any, queue: asyncio.Queue[Any], msg: Any) -> None:
        properties = getattr(msg.properties, "UserProperty", None) if msg.properties else None
        decode = functools.partial(
            wire.decode, properties, msg.payload, max_payload_bytes=self.max_payload_bytes,
            content_type=getattr(msg.properties, "ContentType", None) if msg.properties else None,
        )  # fmt: skip
        settle = functools.partial(self._settle, client, queue, msg)
        await self._submit(Delivery(decode, settle, functools.partial(self._where, msg)))

    def _where(self, msg: Any) -> str:
        return f"topic {shown(msg.topic)} message id {msg.mid}"

    async def _settle(
        self, client: Any, queue: asyncio.Queue[Any], msg: Any, result: Result | None
    ) -> None:
        if result is None or result.outcome.ack:
            client.ack(msg.mid, msg.qos)
        else:  # no nack in MQTT: try it again here after the delay
            asyncio.get_running_loop().call_later(self.redeliver_delay, queue.put_nowait, msg)
