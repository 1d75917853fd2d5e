"""Kafka adapter (confluent-kafka): idempotent producer, key = outbox key, envelope in headers.

``enable.idempotence=true`` (which implies ``acks=all`` and at most 5 in-flight requests per
connection, retried in order) keeps each partition in produce order across internal retries; the
message key is the outbox key, so one key stays in one partition. librdkafka is blocking C code
with its own threads: ``produce`` only enqueues (called in input order from the event loop);
then ``flush`` on a worker thread sends the batch at once (not after ``linger.ms``) and runs the
delivery callbacks there, which record each report in the batch's list and wake the event loop
once, when the batch is complete: no future per message, and no thread polling all along (it
fought the event loop for the GIL while batches were produced).
``message.timeout.ms`` (set from ``timeout``) bounds every delivery: librdkafka gives up on a
message by then and never sends it afterwards. It must end before the relay gives up on the
batch and releases the rows (the relay checks ``features.ack_timeout_seconds``), or a stale
copy could reach Kafka after the key's later rows.

An outage is the broker's, not the messages': when librdkafka reports every broker down, the
messages of the batch still unacknowledged come back as BrokerUnreachableError (the relay gives
the rows back uncharged and pauses), and no later batch is handed to librdkafka until a metadata
request answers again, so nothing waits in its queue to arrive late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outbox.envelope import HEADER_ID, Envelope
from outbox.exceptions import ConfigurationError
from outbox.kit import require
from outbox.wire import kafka as wire
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
from relay.exceptions import BrokerUnreachableError, RetryablePublishError

__all__ = ["KafkaPublisher"]

log = logging.getLogger("relay.brokers.kafka")

#: errors that will not go away by retrying the same message (codes resolved at run time)
_PERMANENT_ERRORS = (
    "MSG_SIZE_TOO_LARGE",
    "_MSG_SIZE_TOO_LARGE",
    "INVALID_RECORD",
    "CORRUPT_MESSAGE",
    "RECORD_LIST_TOO_LARGE",
    "TOPIC_EXCEPTION",
    "_INVALID_ARG",
    "INVALID_REQUIRED_ACKS",
)
#: errors of the destination, not of the message: the topic is paused until it is fixed
_DESTINATION_ERRORS = (
    "UNKNOWN_TOPIC_OR_PART",
    "_UNKNOWN_TOPIC",
    "TOPIC_AUTHORIZATION_FAILED",
)
_ENFORCED = {"enable.idempotence": True, "acks": "all"}


class KafkaPublisher:
    """Publishes to Kafka with an idempotent producer; deliveries awaited per batch."""

    def __init__(
        self,
        bootstrap_servers: str = "127.0.0.1:9092",
        *,
        destinations: Mapping[str, str] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        connect_timeout: float = 5.0,
        config: Mapping[str, Any] | None = None,
        cloudevents: CloudEvents | None = None,
    ) -> None:
        #: the CloudEvents format (outbox.wire.cloudevents), or None: our own
        self._cloudevents = cloudevents
        self._ck = require("confluent_kafka", "kafka")
        for name, value in _ENFORCED.items():
            if config and name in config and str(config[name]).lower() != str(value).lower():
                raise ConfigurationError(
                    f"Kafka option {name}={config[name]!r} would allow loss or reordering: "
                    f"the relay needs {name}={value}",
                    option=name,
                )
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "linger.ms": 5,
            "message.timeout.ms": int(timeout * 1000),
            "socket.connection.setup.timeout.ms": int(connect_timeout * 1000),
            **(config or {}),
            **_ENFORCED,
            "error_cb": self._on_error,
            # librdkafka's own lines (one per failed connection attempt) go through the
            # project's logging and its redactor, at DEBUG: what matters (every broker down,
            # a failed start) the adapter says once, at WARNING, or raises
            "logger": _LIBRDKAFKA_LOG,
        }
        self._bootstrap = bootstrap_servers
        self._destination = Destinations(destinations, broker="kafka", allow=allowed_destinations)
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._producer: Any = None
        self._broken = False
        #: librdkafka said every broker is down (set on its thread); cleared by a metadata answer
        self._all_down = False
        self.features = BrokerFeatures(
            name="kafka",
            dedup_window_seconds=0,  # idempotence dedups internal retries of one producer only
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=int(self._config.get("message.max.bytes", 1_000_000)),
            ack_timeout_seconds=_message_timeout(self._config),
        )

    async def start(self) -> None:
        if self._producer is not None and not self._broken:
            return
        await self.close()
        producer = self._ck.Producer(self._config)
        try:
            await asyncio.to_thread(producer.list_topics, timeout=self._connect_timeout)
        except Exception as exc:
            await asyncio.to_thread(producer.flush, 0)
            raise RetryablePublishError(
                f"cannot reach Kafka at {self._bootstrap} within {self._connect_timeout} s: "
                f"{exc} (is the cluster running and bootstrap address right?)",
                bootstrap_servers=self._bootstrap,
            ) from exc
        self._producer, self._broken = producer, False

    async def check_destination(self, destination: str) -> str:
        """Whether topic ``destination`` exists and how many partitions it has (``outbox relay
        check``; publishes nothing)."""
        from relay.exceptions import DestinationUnavailableError

        await self.start()
        # every topic's metadata: asking for one topic by name may auto-create it
        meta = await asyncio.to_thread(self._producer.list_topics, timeout=self._connect_timeout)
        found = meta.topics.get(destination)
        if found is None or found.error is not None:
            reason = found.error.str() if found is not None and found.error else "not found"
            raise DestinationUnavailableError(f"Kafka topic {destination!r}: {reason}")
        return f"topic {destination}, {len(found.partitions)} partition(s)"

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        remaining = await asyncio.to_thread(producer.flush, self._timeout)
        if remaining:
            log.warning("Kafka close: %d messages not delivered (they will be retried)", remaining)

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        await self.start()
        self._producer.poll(0)  # serve what came in while idle (an error: every broker down?)
        if self._all_down:
            await self._probe()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        batch = Batch(envelopes, self._destination)
        reports = _Reports(loop)
        sent: list[int] = []
        limit = self.features.max_payload_bytes
        produce = self._producer.produce
        report = reports.add
        fields, cloudevents = wire.fields, self._cloudevents
        destinations = batch.destinations
        for i, env in enumerate(envelopes):
            if batch.blocking and batch.skip_if_blocked(i):
                continue
            dest = destinations[i]
            err = None
            if limit and len(env.payload) > limit:
                err = check_size(env, dest, limit, "Kafka message.max.bytes")
            if err is None:
                key, value, headers = fields(env, cloudevents)
                try:  # the common case, without a coroutine or a closure per message
                    produce(dest, value, key, headers=headers, on_delivery=report)
                except BufferError:
                    record = wire.KafkaRecord(key=key, value=value, headers=headers)
                    err = await self._produce_when_room(env, dest, record, report, deadline)
                except Exception as exc:
                    err = self._classify(env, dest, exc)
            if err is not None:
                batch.refuse(i, err)
            else:
                sent.append(i)
        if sent:
            # Send now (the batch is complete: linger.ms has no use) and serve the delivery
            # reports on a worker thread until they are all in, or the deadline. A thread that
            # polled all along would fight the event loop over the GIL while the next batch is
            # produced.
            await asyncio.to_thread(self._producer.flush, max(0.0, deadline - loop.time()))
        complete = await reports.wait(len(sent), max(0.0, deadline - loop.time()) + 1)
        if not complete or reports.failed:
            # The rare path: which message each report is for, from its outbox id header.
            index = {str(envelopes[i].id).encode(): i for i in sent}
            reported: set[int] = set()
            for err, msg in reports.got():
                outbox_id = _outbox_id(msg)
                at = index.get(outbox_id) if outbox_id is not None else None
                if at is None:
                    continue
                reported.add(at)
                if err is not None:
                    failure = self._ck.KafkaException(err)
                    batch.results[at] = self._classify(envelopes[at], destinations[at], failure)
            for i in (i for i in sent if i not in reported):
                batch.results[i] = retryable(
                    f"no delivery report from Kafka within {self._timeout} s",
                    envelopes[i],
                    destinations[i],
                )
        if self._all_down:
            batch.connection_lost(sent, "every Kafka broker is down")
        return batch.results

    async def _probe(self) -> None:
        """Raise BrokerUnreachableError unless the cluster answers a metadata request."""
        try:
            await asyncio.to_thread(self._producer.list_topics, timeout=self._connect_timeout)
        except Exception as exc:
            raise BrokerUnreachableError(
                f"cannot reach Kafka at {self._bootstrap}: {exc} (every broker is down)",
                bootstrap_servers=self._bootstrap,
            ) from exc
        self._all_down = False

    def _on_error(self, error: Any) -> None:
        """librdkafka's error callback (poll thread): note that every broker went down."""
        if error.code() == self._ck.KafkaError._ALL_BROKERS_DOWN:
            # once per outage; not while start() connects (it raises the failure as one line)
            if not self._all_down and self._producer is not None:
                log.warning("Kafka: every broker is down (%s); pausing", error.str())
            self._all_down = True

    async def _produce_when_room(
        self,
        env: Envelope,
        dest: str,
        record: wire.KafkaRecord,
        callback: Callable[[Any, Any], None],
        deadline: float,
    ) -> PublishError | None:
        """librdkafka's local queue is full: wait for deliveries, then enqueue the message."""
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return retryable("librdkafka's local queue is full", env, dest)
            # serve delivery reports (they free the queue) on a worker thread, then try again
            await asyncio.to_thread(self._producer.poll, min(0.1, left))
            try:
                self._producer.produce(
                    dest, value=record.value, key=record.key, headers=record.headers,
                    on_delivery=callback,
                )  # fmt: skip
                return None
            except BufferError:
                continue
            except Exception as exc:
                return self._classify(env, dest, exc)

    def _classify(self, env: Envelope, dest: str, exc: BaseException) -> PublishError:
        error = exc.args[0] if exc.args and hasattr(exc.args[0], "code") else None
        if error is None:
            if isinstance(exc, TypeError | ValueError):
                return permanent(f"invalid Kafka message: {exc}", env, dest, exc)
            return retryable(f"{type(exc).__name__}: {exc}", env, dest, exc)
        if error.fatal():
            self._broken = True  # the producer must be re-created; the next batch does it
            return retryable(f"fatal producer error, recreating it: {error.str()}", env, dest, exc)
        kafka_error = self._ck.KafkaError
        permanent_codes = {
            getattr(kafka_error, n) for n in _PERMANENT_ERRORS if hasattr(kafka_error, n)
        }
        destination_codes = {
            getattr(kafka_error, n) for n in _DESTINATION_ERRORS if hasattr(kafka_error, n)
        }
        if error.code() in destination_codes:
            return unavailable(
                f"Kafka topic {dest!r} cannot be written: {error.str()} (create the topic, or "
                "grant the relay's principal WRITE on it)",
                env,
                dest,
                exc,
            )
        if error.code() in permanent_codes:
            return permanent(f"Kafka rejected the message: {error.str()}", env, dest, exc)
        return retryable(f"Kafka delivery failed: {error.str()}", env, dest, exc)


def _message_timeout(config: Mapping[str, Any]) -> float:
    """How long librdkafka keeps a message (seconds): ``message.timeout.ms`` or its alias."""
    raw = config.get("delivery.timeout.ms", config["message.timeout.ms"])
    try:
        return float(raw) / 1000
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"Kafka option message.timeout.ms / delivery.timeout.ms must be milliseconds, "
            f"got {raw!r}",
            option="message.timeout.ms",
        ) from exc


class _ClientLog:
    """librdkafka's log lines (``logger`` setting) on the ``relay.brokers.kafka.client``
    logger, at DEBUG whatever their syslog level."""

    def __init__(self) -> None:
        self._log = logging.getLogger("relay.brokers.kafka.client")

    def log(self, _level: int, message: str, *args: Any) -> None:
        self._log.debug(message, *args)


_LIBRDKAFKA_LOG = _ClientLog()


def _outbox_id(msg: Any) -> bytes | None:
    """The outbox id header of a produced message (what a delivery report carries)."""
    for name, value in msg.headers() or ():
        if name == HEADER_ID:
            return bytes(value) if value is not None else None
    return None


class _Reports:
    """The delivery reports of one batch.

    librdkafka calls ``add`` on the flushing thread, once per message; a list append is atomic,
    so that thread only appends (and notes a failure), and wakes the event loop once, when the
    count the loop is waiting for is reached: one wake-up per batch, no future and no closure
    per message. Which message a report is for is worked out only when some failed or are
    missing (``publish_batch``'s rare path), from the message's outbox id header.
    """

    __slots__ = ("_done", "_expected", "_got", "_loop", "failed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._got: list[tuple[Any, Any]] = []
        self._expected = -1  # unknown until every message of the batch is handed over
        self._done = asyncio.Event()
        #: some report carried an error
        self.failed = False

    def add(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed = True
        self._got.append((err, msg))
        if len(self._got) == self._expected:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if len(self._got) >= self._expected >= 0:
            self._done.set()

    async def wait(self, expected: int, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait (at most ``timeout`` s) for ``expected`` reports; True if they all came."""
        self._expected = expected
        if len(self._got) < expected:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._done.wait()
        return len(self._got) >= expected

    def got(self) -> list[tuple[Any, Any]]:
        """The reports so far: (error or None, message)."""
        return list(self._got)
