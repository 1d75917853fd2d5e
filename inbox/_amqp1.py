"""AMQP 1.0 receiver (python-qpid-proton): accept after commit, release to redeliver.

Proton runs on a thread of its own (:mod:`outbox._proton`): it reads each transfer's bytes and
hands them to the event loop; the message is decoded on the event loop (a malformed one is
refused there, never on the reactor thread), and its settlement goes back to the reactor.
Credit: ``credit`` unsettled messages at most; one more is granted as each is settled, so a
slow handler stops the broker sending (bounded memory).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from typing import Any

from inbox._consumer import Batching, BrokerConsumer, Delivery, ResultCallback
from inbox._runner import AsyncHandlerRunner, Result
from outbox import _proton
from outbox._optional import require
from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.wire import amqp1 as wire

__all__ = ["Amqp1Consumer"]

#: AMQP delivery states (proton.Delivery's constants)
ACCEPTED, REJECTED, RELEASED = 36, 37, 38


class _Receiver:
    """On the reactor thread: the connection, the receiver link, the unsettled deliveries."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        inbox: asyncio.Queue[tuple[int, bytes] | BaseException],
        address: str,
        credit: int,
        durable: bool,
    ) -> None:
        self._loop, self._inbox = loop, inbox
        self._address, self._credit, self._durable = address, credit, durable
        self.connection: Any = None
        self.receiver: Any = None
        self.lost: str | None = None
        self.opened: asyncio.Future[None] | None = None
        self._unsettled: dict[int, Any] = {}
        self._next = 0

    def connect(self, container: Any, options: dict[str, Any]) -> None:
        proton = require("proton", "amqp1")
        self.connection = container.connect(**options)
        session = self.connection.session()
        session.open()
        self.receiver = session.receiver(f"outbox-inbox-{uuid.uuid4().hex[:8]}")
        self.receiver.source.address = self._address
        if self._durable:  # RabbitMQ declares a /queue/NAME source durable only so
            self.receiver.source.durability = proton.Terminus.DELIVERIES
        self.receiver.rcv_settle_mode = proton.Link.RCV_FIRST
        self.receiver.open()
        self.receiver.flow(self._credit)

    def settle(self, number: int, state: int) -> None:
        dlv = self._unsettled.pop(number, None)
        if dlv is None or self.lost is not None:
            return  # the connection is gone: the broker redelivers it
        dlv.update(state)
        dlv.settle()
        self.receiver.flow(1)

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()

    # ---- proton events --------------------------------------------------------------------

    def on_link_remote_open(self, _event: Any) -> None:
        if self.opened is not None:
            _proton.resolve(self._loop, self.opened, None)
            self.opened = None

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        if not dlv.readable or dlv.partial:
            return
        data = bytes(event.link.recv(dlv.pending))
        event.link.advance()
        self._next += 1
        self._unsettled[self._next] = dlv
        self._loop.call_soon_threadsafe(self._inbox.put_nowait, (self._next, data))

    def on_link_remote_close(self, event: Any) -> None:
        self._gone(_describe(event.link.remote_condition) or "the broker closed the link")

    def on_session_remote_close(self, event: Any) -> None:
        self._gone(_describe(event.session.remote_condition) or "the broker ended the session")

    def on_connection_remote_close(self, event: Any) -> None:
        self._gone(_describe(event.connection.remote_condition) or "the broker closed it")

    def on_transport_error(self, event: Any) -> None:
        self._gone(_describe(event.transport.condition) or "transport error")

    def on_transport_closed(self, _event: Any) -> None:
        self._gone("connection closed")

    def _gone(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        self._unsettled.clear()
        error = ConnectionError(f"AMQP 1.0 receiver of {self._address!r} lost: {reason}")
        if self.opened is not None:
            _proton.fail(self._loop, self.opened, error)
            self.opened = None
        self._loop.call_soon_threadsafe(self._inbox.put_nowait, error)


def _describe(condition: Any) -> str:
    if condition is None:
        return ""
    description = getattr(condition, "description", None)
    return f"{condition.name}: {description}" if description else str(condition.name)


def _decode(data: bytes, max_bytes: int) -> Envelope:
    """The envelope of a transfer's bytes; InvalidMessageError for anything else."""
    if len(data) > max_bytes:
        raise InvalidMessageError(
            f"AMQP message of {len(data)} bytes, above the consumer's limit of {max_bytes}",
            reason="payload_too_large",
        )
    proton = require("proton", "amqp1")
    message = proton.Message()
    try:
        message.decode(data)
        properties, body = message.properties, message.body
    except Exception as exc:  # proton's codec on hostile bytes: any error is a refusal
        raise InvalidMessageError(
            f"AMQP message cannot be decoded ({type(exc).__name__})", reason="bad_format"
        ) from exc
    return wire.decode(properties, body)


class Amqp1Consumer(BrokerConsumer):
    """Receive from ``address`` (a queue, or a topic's subscription) with ``credit`` unsettled
    messages in flight.

    A processed message is ``accepted`` after its transaction commits; a failed or out-of-order
    one is ``released`` after ``redeliver_delay`` (the broker delivers it again); one that is
    not an outbox message is ``rejected`` (to the queue's dead-letter queue, if it has one).
    ``run()`` raises ConnectionError when the connection or link is lost; its unsettled
    messages go back to the queue.
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        address: str,
        url: str = "amqp1://127.0.0.1:5672",
        credit: int = 10,
        redeliver_delay: float = 1.0,
        on_result: ResultCallback | None = None,
        batching: Batching | None = None,
        durable: bool = True,
        max_message_bytes: int = 16 * 1024 * 1024,
        connect_timeout: float = 10.0,
        sasl_mechanisms: str | None = None,
        tls_ca: str | None = None,
        tls_verify: bool = True,
        virtual_host: str | None = None,
    ) -> None:
        require("proton", "amqp1")  # fail at construction, naming the extra
        super().__init__(
            runner, redeliver_delay=redeliver_delay, on_result=on_result, batching=batching
        )
        self.address = address
        self._endpoint = _proton.endpoint(url)
        self.url = self._endpoint.shown()  # never the password
        self._options = _proton.connect_options(
            self._endpoint, sasl_mechanisms=sasl_mechanisms, tls_ca=tls_ca,
            tls_verify=tls_verify, virtual_host=virtual_host, heartbeat=30.0,
        )  # fmt: skip
        self.durable = durable
        self.max_message_bytes = max_message_bytes
        self.connect_timeout = connect_timeout
        #: unsettled messages in flight: at least a whole transaction batch per worker
        self.credit = max(credit, self.batching.size * self.batching.workers)
        self._handler: _Receiver | None = None
        self._reactor: _proton.Reactor | None = None

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, bytes] | BaseException] = asyncio.Queue()
        handler = _Receiver(loop, inbox, self.address, self.credit, self.durable)
        reactor = _proton.Reactor(handler, f"outbox-inbox-amqp1-{uuid.uuid4().hex[:6]}")
        handler.opened = loop.create_future()
        opened = handler.opened
        self._handler, self._reactor = handler, reactor
        reactor.start()
        try:
            reactor.call(lambda: handler.connect(reactor.container, self._options))
            try:
                await asyncio.wait_for(opened, self.connect_timeout)
            except TimeoutError:
                raise ConnectionError(
                    f"no answer from the AMQP 1.0 broker at {self.url} within "
                    f"{self.connect_timeout} s (is it running and the URL right?)"
                ) from None
            self.ready.set()
            stopping = asyncio.ensure_future(self._stopping.wait())
            try:
                while not self.stopping:
                    got = asyncio.ensure_future(inbox.get())
                    await asyncio.wait({got, stopping}, return_when=asyncio.FIRST_COMPLETED)
                    if not got.done():
                        got.cancel()
                        break
                    items = [got.result()]
                    while not inbox.empty():
                        items.append(inbox.get_nowait())
                    deliveries = []
                    for item in items:
                        if isinstance(item, BaseException):
                            raise item
                        deliveries.append(self._delivery(*item))
                    await self._submit(*deliveries)
            finally:
                stopping.cancel()
        finally:
            await self._finish_workers()
            if reactor.alive:
                reactor.call(handler.close)
            await asyncio.to_thread(reactor.stop, 5.0)

    def _delivery(self, number: int, data: bytes) -> Delivery:
        decode: Callable[[], Envelope] = functools.partial(_decode, data, self.max_message_bytes)
        return Delivery(decode, functools.partial(self._settle, number))

    async def _settle(self, number: int, result: Result | None) -> None:
        handler, reactor = self._handler, self._reactor
        if handler is None or reactor is None:
            return
        if result is None:
            state = REJECTED  # not an outbox message: never redeliver it
        elif result.outcome.ack:
            state = ACCEPTED
        else:
            await self._wait_stopping(self.redeliver_delay)
            state = RELEASED
        if handler.lost is not None:  # as the other consumers: a lost broker ends run()
            raise ConnectionError(f"AMQP 1.0 connection lost: {handler.lost}")
        reactor.call(lambda: handler.settle(number, state))
