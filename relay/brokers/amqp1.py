"""AMQP 1.0 adapter (python-qpid-proton): Azure Service Bus, ActiveMQ Artemis, Solace, Qpid,
RabbitMQ's ``rabbitmq_amqp1_0`` plugin.

``amqp1://[user:password@]host[:port]`` (``amqp1s://`` for TLS); each outbox topic's address
(queue or topic name, ``/queue/NAME`` on RabbitMQ 3.x) comes from ``destinations``. The message
is :mod:`outbox.wire.amqp1`'s (``message-id`` = id, ``group-id`` = key), sent durable and
unsettled; it counts as published only on the broker's ``accepted`` disposition. ``rejected``
is a PermanentPublishError carrying the broker's error (unless the error is a throttle: then
retryable), ``released`` and ``modified`` are retryable.

Order: one sender link per address, each on its own session (a broker ends the session of an
address it refuses, and so takes down only that address's link). A link delivers in order, so
one key's messages reach the broker as given; a batch is pipelined up to the link's credit.

Threads: proton runs on a thread of its own (:mod:`outbox.amqp1_reactor`); a batch crosses to it in
one call and comes back in one, so the crossing costs per batch, not per message.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox import amqp1_reactor as _proton
from outbox.envelope import Envelope
from outbox.kit import require
from outbox.wire import amqp1 as wire
from outbox.wire.cloudevents import CloudEvents
from relay.brokers._batch import Batch, check_size, permanent, retryable, unavailable, unreachable
from relay.brokers.base import DEFAULT_ACK_TIMEOUT, BrokerFeatures, Destinations
from relay.exceptions import BrokerUnreachableError, NotSentError

__all__ = ["Amqp1Publisher"]

log = logging.getLogger("relay.brokers.amqp1")

#: conditions of a refused address: a configuration to fix (the topic waits, nothing is dead)
UNAVAILABLE = frozenset({
    "amqp:not-found", "amqp:unauthorized-access", "amqp:precondition-failed", "amqp:not-allowed",
})  # fmt: skip
#: conditions of a rejected message that a later try may pass (throttling, a busy broker)
THROTTLED = frozenset({
    "amqp:resource-limit-exceeded", "amqp:internal-error", "com.microsoft:server-busy",
    "com.microsoft:timeout", "amqp:connection:forced",
})  # fmt: skip
#: messages encoded per hand-over to the reactor thread
SLICE = 100
#: AMQP delivery states (proton.Delivery's constants, read without importing proton)
ACCEPTED, REJECTED, RELEASED, MODIFIED = 36, 37, 38, 39


@dataclass(eq=False)
class _Job:
    """One batch on the reactor thread: an outcome per item, the future to resolve."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    outcomes: list[tuple[Any, ...] | None]
    remaining: int
    abandoned: bool = False
    blocked: set[tuple[str, str]] = field(default_factory=set)

    def set(self, index: int, outcome: tuple[Any, ...]) -> None:
        if self.abandoned or self.outcomes[index] is not None:
            return
        self.outcomes[index] = outcome
        self.remaining -= 1
        if self.remaining == 0:
            _proton.resolve(self.loop, self.future, None)


#: (job, item index, encoded message, (topic, key)) waiting for credit
_Item = tuple[_Job, int, bytes, tuple[str, str]]


class _Link:
    def __init__(self, address: str, session: Any, sender: Any) -> None:
        self.address, self.session, self.sender = address, session, sender
        self.queue: deque[_Item] = deque()
        self.inflight: dict[str, tuple[_Job, int]] = {}


class _Handler:
    """Everything on the reactor thread: the connection, a link per address, the outcomes."""

    def __init__(self, durable_links: bool) -> None:
        self._durable_links = durable_links
        self.connection: Any = None
        self.connected = False
        self.opened: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self.links: dict[str, _Link] = {}
        self._tags = itertools.count()

    # ---- called through Reactor.call ----------------------------------------------------

    def connect(self, container: Any, options: dict[str, Any]) -> None:
        self.connection = container.connect(**options)

    def submit(self, job: _Job, items: list[tuple[int, str, bytes, tuple[str, str]]]) -> None:
        if not self.connected:
            for index, *_ in items:
                job.set(index, ("lost", "not connected"))
            return
        touched: dict[str, _Link] = {}
        for index, address, data, key in items:
            link = self.links.get(address) or self._attach(address)
            link.queue.append((job, index, data, key))
            touched[address] = link
        for link in touched.values():
            self._flush(link)

    def abandon(self, job: _Job) -> None:
        """The caller gave up on ``job``: nothing of it not yet sent will be."""
        job.abandoned = True
        for link in self.links.values():
            for tag in [t for t, (j, _) in link.inflight.items() if j is job]:
                del link.inflight[tag]

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()

    # ---- proton events --------------------------------------------------------------------

    def on_connection_remote_open(self, _event: Any) -> None:
        self.connected = True
        self._opened(None)

    def on_connection_remote_close(self, event: Any) -> None:
        self._lost(_describe(event.connection.remote_condition) or "connection closed by broker")
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        self._lost(_describe(event.transport.condition) or "transport error")

    def on_transport_closed(self, _event: Any) -> None:
        self._lost("connection closed")

    def on_session_remote_close(self, event: Any) -> None:
        condition = event.session.remote_condition
        for address, link in list(self.links.items()):
            if _same(link.session, event.session):
                self._fail_link(address, condition)
        event.session.close()

    def on_link_remote_close(self, event: Any) -> None:
        for address, link in list(self.links.items()):
            if _same(link.sender, event.link):
                self._fail_link(address, event.link.remote_condition)
        event.link.close()

    def on_link_flow(self, event: Any) -> None:
        link = self.links.get(event.link.name)
        if link is not None:
            self._flush(link)

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        link = self.links.get(event.link.name)
        state = dlv.remote_state
        if link is None or not state:
            return
        entry = link.inflight.pop(dlv.tag, None)
        dlv.settle()
        if entry is None:
            return
        job, index = entry
        if state == ACCEPTED:
            job.set(index, ("accepted",))
        elif state == REJECTED:
            condition = dlv.remote.condition
            job.set(index, ("rejected", _name(condition), _describe(condition)))
        elif state == RELEASED:
            job.set(index, ("released",))
        else:  # MODIFIED (or a state AMQP adds later): not stored; try again
            job.set(index, ("modified",))

    # ---- internals ------------------------------------------------------------------------

    def _opened(self, error: str | None) -> None:
        if self.opened is None:
            return
        loop, future = self.opened
        self.opened = None
        if error is None:
            _proton.resolve(loop, future, None)
        else:
            _proton.fail(loop, future, ConnectionError(error))

    def _attach(self, address: str) -> _Link:
        proton = require("proton", "amqp1")
        session = self.connection.session()
        session.open()
        # the link's name is the address: one link per address, found again by its name
        sender = session.sender(address)
        sender.target.address = address
        if self._durable_links:  # RabbitMQ declares a /queue/NAME target durable only so
            sender.target.durability = proton.Terminus.DELIVERIES
        sender.snd_settle_mode = proton.Link.SND_UNSETTLED
        sender.open()
        link = self.links[address] = _Link(address, session, sender)
        return link

    def _flush(self, link: _Link) -> None:
        sender = link.sender
        limit = sender.remote_max_message_size
        while link.queue and sender.credit > 0:
            job, index, data, key = link.queue.popleft()
            if job.abandoned:
                continue
            if key in job.blocked:
                job.set(index, ("not_sent",))
                continue
            if limit and len(data) > limit:
                job.blocked.add(key)
                job.set(index, ("too_large", limit))
                continue
            tag = str(next(self._tags))
            sender.delivery(tag)
            sender.stream(data)
            sender.advance()
            link.inflight[tag] = (job, index)

    def _fail_link(self, address: str, condition: Any) -> None:
        link = self.links.pop(address)
        outcome = ("link", _name(condition), _describe(condition) or "link closed by broker")
        for job, index in link.inflight.values():
            job.set(index, outcome)
        for job, index, _, _ in link.queue:
            job.set(index, outcome)
        link.queue.clear()
        link.inflight.clear()

    def _lost(self, reason: str) -> None:
        self.connected = False
        self._opened(reason)
        for address in list(self.links):
            link = self.links.pop(address)
            for job, index in link.inflight.values():
                job.set(index, ("lost", reason))
            for job, index, _, _ in link.queue:
                job.set(index, ("lost", reason))


def _same(a: Any, b: Any) -> bool:
    return a is b or getattr(a, "_impl", a) == getattr(b, "_impl", b)


def _name(condition: Any) -> str:
    return str(getattr(condition, "name", "") or "")


def _describe(condition: Any) -> str:
    if condition is None:
        return ""
    description = getattr(condition, "description", None)
    return f"{condition.name}: {description}" if description else str(condition.name)


class Amqp1Publisher:
    """Publishes to an AMQP 1.0 broker: one connection, a sender link per address."""

    def __init__(
        self,
        url: str = "amqp1://127.0.0.1:5672",
        *,
        destinations: Mapping[str, str] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        partitions: Mapping[str, int] | None = None,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        connect_timeout: float = 5.0,
        max_payload_bytes: int = 0,
        durable: bool = True,
        sasl_mechanisms: str | None = None,
        tls_ca: str | None = None,
        tls_verify: bool = True,
        virtual_host: str | None = None,
        heartbeat: float | None = 30.0,
        cloudevents: CloudEvents | None = None,
    ) -> None:
        #: the CloudEvents format (outbox.wire.cloudevents), or None: our own
        self._cloudevents = cloudevents
        self._proton = require("proton", "amqp1")
        self._endpoint = _proton.endpoint(url)
        self._options = _proton.connect_options(
            self._endpoint, sasl_mechanisms=sasl_mechanisms, tls_ca=tls_ca,
            tls_verify=tls_verify, virtual_host=virtual_host, heartbeat=heartbeat,
        )  # fmt: skip
        self._destination = Destinations(
            destinations, broker="amqp1", allow=allowed_destinations, partitions=partitions
        )
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._durable = durable
        self._reactor: _proton.Reactor | None = None
        self._handler: _Handler | None = None
        self._starting = asyncio.Lock()  # one connection, even when two batches start it
        self.features = BrokerFeatures(
            name="amqp1",
            dedup_window_seconds=0,  # Service Bus's duplicate detection is a queue option
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=max_payload_bytes,
            ack_timeout_seconds=timeout,
        )

    async def start(self) -> None:
        async with self._starting:
            await self._start()

    async def _start(self) -> None:
        handler, reactor = self._handler, self._reactor
        if handler is not None and handler.connected and reactor is not None and reactor.alive:
            return
        await self.close()
        loop = asyncio.get_running_loop()
        handler = _Handler(self._durable)
        reactor = _proton.Reactor(handler, f"outbox-amqp1-{uuid.uuid4().hex[:6]}")
        opened: asyncio.Future[None] = loop.create_future()
        handler.opened = (loop, opened)
        reactor.start()
        reactor.call(lambda: handler.connect(reactor.container, self._options))
        try:
            await asyncio.wait_for(opened, self._connect_timeout)
        except (Exception, asyncio.CancelledError) as exc:
            await asyncio.to_thread(reactor.stop, 2.0)
            if isinstance(exc, asyncio.CancelledError):
                raise
            why = "no answer" if isinstance(exc, TimeoutError) else str(exc)
            raise BrokerUnreachableError(
                f"cannot connect to the AMQP 1.0 broker at {self._endpoint.shown()}: {why} "
                f"(is the server running, the URL right, and the user allowed?)",
                url=self._endpoint.shown(),
            ) from None
        self._handler, self._reactor = handler, reactor

    async def close(self) -> None:
        handler, reactor = self._handler, self._reactor
        self._handler = self._reactor = None
        if reactor is None or handler is None:
            return
        if reactor.alive:
            reactor.call(handler.close)
        await asyncio.to_thread(reactor.stop, 5.0)

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        await self.start()
        handler, reactor = self._handler, self._reactor
        assert handler is not None
        assert reactor is not None
        batch = Batch(envelopes, self._destination)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        todo: list[tuple[int, Envelope, str]] = []
        limit = self.features.max_payload_bytes
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            err = check_size(env, dest, limit, "configured max_payload_bytes")
            if err is not None:
                batch.refuse(i, err)
                continue
            todo.append((i, env, dest))
        if not todo:
            return batch.results
        job = _Job(loop, loop.create_future(), [None] * len(envelopes), len(todo))
        # handed over in slices, so the reactor sends the first while the rest are encoded
        for start in range(0, len(todo), SLICE):
            items = [(i, dest, self._encode(env), (env.topic, env.key))
                     for i, env, dest in todo[start : start + SLICE]]  # fmt: skip
            reactor.call(functools.partial(handler.submit, job, items))
        try:
            await asyncio.wait_for(asyncio.shield(job.future), max(0.0, deadline - loop.time()))
        except TimeoutError:
            try:
                await reactor.run(lambda: handler.abandon(job), 2.0)
            except TimeoutError:
                job.abandoned = True  # the reactor is stuck: nothing more of it counts
        lost = []
        for i, _, _ in todo:
            env, dest = envelopes[i], batch.destinations[i]
            outcome = job.outcomes[i]
            batch.results[i] = self._result(env, dest, outcome)
            if outcome is not None and outcome[0] == "lost":
                lost.append(i)
        if lost:
            batch.connection_lost(lost, "AMQP 1.0 connection lost")
        return batch.results

    def _encode(self, env: Envelope) -> bytes:
        proton = self._proton
        m = wire.encode(env, self._cloudevents)
        message = proton.Message(
            body=m.body, inferred=True, id=m.message_id, group_id=m.group_id,
            subject=m.subject, properties=m.properties, durable=self._durable,
        )  # fmt: skip
        if m.group_sequence is not None:
            message.group_sequence = m.group_sequence
        if m.content_type is not None:
            message.content_type = m.content_type
        return bytes(message.encode())

    def _result(self, env: Envelope, dest: str, outcome: tuple[Any, ...] | None) -> Any:
        if outcome is None:
            return retryable(f"no disposition from the broker within {self._timeout} s", env, dest)
        kind = outcome[0]
        if kind == "accepted":
            return None
        if kind == "released":
            return retryable("the broker released the message (not stored)", env, dest)
        if kind == "modified":
            return retryable("the broker returned the message modified (not stored)", env, dest)
        if kind == "lost":
            return unreachable(f"connection lost before the disposition: {outcome[1]}", env, dest)
        if kind == "not_sent":
            return retryable("not sent: an earlier message of its key in this batch was refused",
                             env, dest, kind=NotSentError)  # fmt: skip
        if kind == "too_large":
            return permanent(f"larger than the link's max-message-size of {outcome[1]} bytes",
                             env, dest)  # fmt: skip
        condition, text = outcome[1], outcome[2]
        if kind == "link":
            if condition in UNAVAILABLE:
                return unavailable(
                    f"the broker refused the address ({text}): create it, allow this user to "
                    "send to it, or map the topic to another address (destinations)",
                    env,
                    dest,
                )
            return retryable(f"the broker closed the link ({text})", env, dest)
        # rejected
        if condition in THROTTLED:
            return retryable(f"the broker rejected the message for now ({text})", env, dest)
        if condition in UNAVAILABLE:
            return unavailable(f"the broker refused the address ({text})", env, dest)
        return permanent(f"the broker rejected the message ({text or 'no reason given'})",
                         env, dest)  # fmt: skip
