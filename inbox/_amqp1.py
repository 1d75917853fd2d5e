"""AMQP 1.0 receiver (python-qpid-proton): accept after commit, retry or release to redeliver.

Proton runs on a thread of its own (:mod:`outbox.amqp1_reactor`): it reads each transfer's bytes and
hands them to the event loop; the message is decoded on the event loop (a malformed one is
refused there, never on the reactor thread), and its settlement goes back to the reactor.
Credit: ``credit`` unsettled messages at most; one more is granted as each is settled, so a
slow handler stops the broker sending (bounded memory). An early message (its key's previous
one not applied yet) is set aside unsettled, up to ``credit`` of them, and lends its credit to
the next message: at most twice ``credit`` unsettled messages then.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any, Unpack

from inbox._consumer import BrokerConsumer, ConsumerOptions, Delivery
from inbox._runner import AsyncHandlerRunner, Result
from outbox import amqp1_reactor as _proton
from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.kit import (
    MAX_HEADER_NAME_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_RECEIVED_HEADERS,
    require,
)
from outbox.wire import amqp1 as wire

__all__ = ["Amqp1Consumer"]

log = logging.getLogger("inbox.consumer")

#: room for a message's sections beside its body: the headers' bound (80 of 16 KiB at most)
MAX_MESSAGE_OVERHEAD = MAX_RECEIVED_HEADERS * (MAX_HEADER_VALUE_BYTES + MAX_HEADER_NAME_BYTES + 16)
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
        #: deliveries set aside that lent their credit to another message: none is granted
        #: again when they are settled
        self._lent: set[int] = set()
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
        if number in self._lent:
            self._lent.discard(number)
        else:
            self.receiver.flow(1)

    def lend(self, number: int) -> None:
        """``number`` is set aside unsettled: one more credit, in its place."""
        if self.lost is None and number in self._unsettled and number not in self._lent:
            self._lent.add(number)
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
        self._lent.clear()
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
    """The envelope of a transfer's bytes; InvalidMessageError for anything else. The whole
    message (properties and body) is held to the body's bound before proton decodes it."""
    if len(data) > max_bytes + MAX_MESSAGE_OVERHEAD:
        raise InvalidMessageError(
            f"AMQP message of {len(data)} bytes, above the consumer's max_payload_bytes "
            f"({max_bytes}) and room for its properties",
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
    return wire.decode(properties, body, max_payload_bytes=max_bytes)


class Amqp1Consumer(BrokerConsumer):
    """Receive from ``address`` (a queue, or a topic's subscription) with ``credit`` unsettled
    messages in flight.

    A processed message is ``accepted`` after its transaction commits; one that is not an
    outbox message is ``rejected`` (to the queue's dead-letter queue, if it has one). A failed
    one stays unsettled and is applied again after ``redeliver_delay=`` (until the inbox's
    ``max_attempts``). An early one (out of its key's order) is set aside unsettled (up to
    ``credit`` of them, each lending its credit to the next message): applied as soon as its
    key's previous message is settled here, ``released`` after 5 s otherwise (at least
    ``redeliver_delay=``; the broker delivers it again). Why not release them at once:
    RabbitMQ puts a released message back at the head of its queue, and hands it back only
    after what it sent meanwhile; releasing each failed and early message after a delay made
    a backlog behind a failing message take minutes to drain.
    When an established connection or its link is lost, its unsettled messages go back to the
    queue and the consumer connects again (``reconnect=False``: ``.run()`` raises
    ConnectionError instead); the first connection failing raises ConnectionError.
    """

    defers_release = True

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        address: str,
        url: str = "amqp1://127.0.0.1:5672",
        credit: int = 10,
        durable: bool = True,
        connect_timeout: float = 10.0,
        sasl_mechanisms: str | None = None,
        tls_ca: str | None = None,
        tls_verify: bool = True,
        virtual_host: str | None = None,
        reconnect: bool = True,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        require("proton", "amqp1")  # fail at construction, naming the extra
        super().__init__(runner, **options)
        self.address = address
        self._endpoint = _proton.endpoint(url)
        self.url = self._endpoint.shown()  # never the password
        self._options = _proton.connect_options(
            self._endpoint, sasl_mechanisms=sasl_mechanisms, tls_ca=tls_ca,
            tls_verify=tls_verify, virtual_host=virtual_host, heartbeat=30.0,
        )  # fmt: skip
        self.durable = durable
        self.connect_timeout = connect_timeout
        #: unsettled messages in flight: at least a whole transaction batch per worker
        self.credit = max(credit, self.batching.size * self.batching.workers)
        #: reconnect (with backoff, at most 5 s apart) when an established connection is lost
        self.reconnect = reconnect
        self._received = False
        self.set_aside = self.credit

    async def _consume(self) -> None:
        failures = 0
        try:
            while not self.stopping:
                try:
                    await self._session()
                    return
                except ConnectionError as exc:
                    if not self.reconnect or not self.ready.is_set():
                        raise  # the first connection fails loudly: a URL or credentials to fix
                    failures = 0 if self._received else failures + 1
                    delay = min(5.0, 0.2 * 2 ** min(failures, 5))
                    log.warning("inbox: %s; connecting again in %.1f s", exc, delay)
                    await self._wait_stopping(delay)
        finally:
            await self._finish_workers()

    async def _session(self) -> None:
        """One connection: receive until ``stop()`` (returns) or until the connection or link
        is lost (ConnectionError; its unsettled messages go back to the queue)."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, bytes] | BaseException] = asyncio.Queue()
        handler = _Receiver(loop, inbox, self.address, self.credit, self.durable)
        reactor = _proton.Reactor(handler, f"outbox-inbox-amqp1-{uuid.uuid4().hex[:6]}")
        handler.opened = loop.create_future()
        opened = handler.opened
        self._received = False
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
                        deliveries.append(self._delivery(handler, reactor, *item))
                    self._received = True
                    await self._submit(*deliveries)
            finally:
                stopping.cancel()
        finally:
            await self._finish_session(handler, reactor)

    async def _finish_session(self, handler: _Receiver, reactor: _proton.Reactor) -> None:
        if self.stopping:
            await self._finish_workers()  # the batches in hand are settled on this connection
        if reactor.alive:
            reactor.call(handler.close)
        await asyncio.to_thread(reactor.stop, 5.0)

    def _delivery(
        self, handler: _Receiver, reactor: _proton.Reactor, number: int, data: bytes
    ) -> Delivery:
        decode: Callable[[], Envelope] = functools.partial(_decode, data, self.max_payload_bytes)
        settle = functools.partial(self._settle, handler, reactor, number)
        lend = functools.partial(self._lend, handler, reactor, number)
        return Delivery(decode, settle, functools.partial(self._where, number), lend)

    def _lend(self, handler: _Receiver, reactor: _proton.Reactor, number: int) -> None:
        if handler.lost is None:
            with contextlib.suppress(Exception):  # the reactor closed: nothing to lend
                reactor.call(lambda: handler.lend(number))

    def _where(self, number: int) -> str:
        return f"address {self.address!r} delivery {number} of its connection"

    async def _settle(
        self, handler: _Receiver, reactor: _proton.Reactor, number: int, result: Result | None
    ) -> None:
        if result is None:
            state = REJECTED  # not an outbox message: never redeliver it
        elif result.outcome.ack:
            state = ACCEPTED
        else:  # after redeliver_delay: the base class waits (BrokerConsumer._defer)
            state = RELEASED
        if handler.lost is not None:
            return  # its connection is gone: the broker delivers it again (a duplicate then)
        try:
            reactor.call(lambda: handler.settle(number, state))
        except Exception as exc:  # the reactor closed meanwhile: the same as above
            log.debug("inbox: AMQP 1.0 settlement after the connection closed: %s", exc)
