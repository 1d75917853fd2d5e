"""NATS JetStream adapter (nats-py): ``Nats-Msg-Id`` dedup, async publishes, PubAcks awaited.

Order: every message is handed to ``publish_async`` one after the other on one connection, so
the server stores one subject's messages in input order; all PubAcks are then awaited together
with one deadline. A re-sent id inside the stream's ``duplicate_window`` is acknowledged with
``duplicate=True`` and not stored again.

Outages: nats-py reconnects underneath and, while reconnecting, buffers publishes to send them
after the reconnect. So nothing is published while the connection is down: ``publish_batch``
raises BrokerUnreachableError (the relay releases the rows without counting an attempt and
pauses), and the messages of a batch whose connection dropped before their PubAck come back as
BrokerUnreachableError.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from outbox._optional import require
from outbox._redact import redact
from outbox.envelope import Envelope
from outbox.wire import nats as wire
from relay.brokers._batch import (
    Batch,
    PublishError,
    check_size,
    permanent,
    retryable,
    unavailable,
    unreachable,
)
from relay.brokers.base import DEFAULT_ACK_TIMEOUT, BrokerFeatures, Destinations

__all__ = ["NatsPublisher"]

log = logging.getLogger("relay.brokers.nats")

DEFAULT_DUPLICATE_WINDOW = 120.0  # nats-server StreamDefaultDuplicatesWindow
# What the NATS protocol cannot carry in a header name / value (the server closes the connection).
_BAD_NAME = re.compile(r"[:\r\n ]")
_BAD_VALUE = re.compile(r"[\r\n]")


class NatsPublisher:
    """Publishes to NATS JetStream; one connection, many publishes in flight."""

    def __init__(
        self,
        servers: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        destinations: Mapping[str, str] | None = None,
        stream: str | None = None,
        stream_subjects: Sequence[str] | None = None,
        create_stream: bool = False,
        duplicate_window: float = DEFAULT_DUPLICATE_WINDOW,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        connect_timeout: float = 5.0,
        max_in_flight: int = 4000,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._nats = require("nats", "nats")
        self._servers = [servers] if isinstance(servers, str) else list(servers)
        self._destination = Destinations(destinations)
        self._stream = stream
        self._stream_subjects = list(stream_subjects or [])
        self._create_stream = create_stream
        self._duplicate_window = duplicate_window
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_in_flight = max_in_flight
        self._connect_options = dict(connect_options or {})
        self._nc: Any = None
        self._last_error: BaseException | None = None
        self._js: Any = None
        self.features = self._features(max_payload=1024 * 1024, window=duplicate_window)

    def _features(self, max_payload: int, window: float) -> BrokerFeatures:
        return BrokerFeatures(
            name="nats",
            dedup_window_seconds=window,
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=max_payload,
            ack_timeout_seconds=self._timeout,
        )

    async def start(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            return
        self._last_error = None
        try:
            nc = await asyncio.wait_for(self._connect(), self._connect_timeout * 2)
        except Exception as exc:
            raise _unreachable(self._servers, self._last_error or exc) from exc
        self._nc = nc
        self._js = nc.jetstream(
            timeout=self._timeout, publish_async_max_pending=self._max_in_flight
        )
        window = self._duplicate_window
        if self._stream is not None:
            window = await self._ensure_stream()
        self.features = self._features(max_payload=nc.max_payload, window=window)

    async def _connect(self) -> Any:
        options: dict[str, Any] = {
            "connect_timeout": self._connect_timeout,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            "allow_reconnect": True,
            "error_cb": self._on_error,
            **self._connect_options,
        }
        return await self._nats.connect(servers=self._servers, **options)

    async def _ensure_stream(self) -> float:
        """The stream's dedup window; creates the stream first when told to."""
        js_errors = require("nats.js.errors", "nats")
        try:
            info = await self._js.stream_info(self._stream)
        except js_errors.NotFoundError:
            if not self._create_stream:
                await self.close()
                raise _config_error(
                    f"JetStream stream {self._stream!r} does not exist: create it, or pass "
                    "create_stream=True"
                ) from None
            info = await self._js.add_stream(
                name=self._stream,
                subjects=self._stream_subjects or [f"{self._stream}.>"],
                duplicate_window=self._duplicate_window,
            )
        return float(info.config.duplicate_window or DEFAULT_DUPLICATE_WINDOW)

    async def _on_error(self, exc: Exception) -> None:
        self._last_error = exc
        log.warning("NATS connection error: %s", exc)

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is None or nc.is_closed:
            return
        try:
            await nc.flush(timeout=self._timeout)
        except Exception as exc:  # closing anyway; nothing is lost, unacked messages retry
            log.warning("NATS flush before close failed: %s", exc)
        await nc.close()

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        if self._nc is None or self._nc.is_closed:
            await self.start()
        nc = self._nc
        if not nc.is_connected:
            # nats-py would buffer the messages and send them after reconnecting, while the
            # relay sends them again: publish nothing (the relay releases the rows and pauses)
            raise _unreachable(self._servers, ConnectionError("not connected (reconnecting)"))
        batch = Batch(envelopes, self._destination)
        pending: dict[int, asyncio.Future[Any]] = {}
        deadline = asyncio.get_running_loop().time() + self._timeout
        publish = self._js.publish_async
        # publishes that fit before max_in_flight is reached: the pending count is read again
        # (and waited on) only when they are used up, not per message
        room = self._max_in_flight - self._js.publish_async_pending()
        for i, env, dest in batch.items():
            if batch.blocking and batch.skip_if_blocked(i):
                continue
            message = wire.encode(env)
            err = self._refusal(env, dest, message.headers)
            if err is None and room <= 0:
                err = await self._room(env, dest, pending, deadline)
                room = self._max_in_flight - self._js.publish_async_pending()
            if err is None:
                try:
                    pending[i] = await publish(dest, message.data, headers=message.headers)
                    room -= 1
                    continue
                except Exception as exc:
                    err = self._classify(env, dest, exc)
            batch.refuse(i, err)
        await batch.settle(
            pending,
            max(0.0, deadline - asyncio.get_running_loop().time()),
            lambda i, exc: self._classify(envelopes[i], batch.destinations[i], exc),
            "PubAck",
        )
        if not nc.is_connected:
            batch.connection_lost(list(pending), "NATS connection lost")
        return batch.results

    async def _room(
        self,
        env: Envelope,
        dest: str,
        pending: Mapping[int, asyncio.Future[Any]],
        deadline: float,
    ) -> PublishError | None:
        """Wait (until the deadline) for an ack when ``max_in_flight`` publishes are unacked.

        nats-py's own stall wait costs a task per message, and its futures never time out.
        """
        while self._js.publish_async_pending() >= self._max_in_flight:
            waiting = [f for f in pending.values() if not f.done()][:1]
            remaining = deadline - asyncio.get_running_loop().time()
            if not waiting or remaining <= 0:
                return retryable(f"{self._max_in_flight} publishes still unacked", env, dest)
            await asyncio.wait(waiting, timeout=remaining)
        return None

    def _refusal(self, env: Envelope, dest: str, headers: Mapping[str, str]) -> PublishError | None:
        """Refuse what the server would reject by closing the connection (and so fail all).

        Per message, on the relay's hot path: one pattern search over all names and one over
        all values; the header at fault is looked for only when one of them matches.
        """
        names, values = "".join(headers), "".join(headers.values())
        if _BAD_NAME.search(names) or _BAD_VALUE.search(values):
            for name, value in headers.items():
                if _BAD_NAME.search(name) or _BAD_VALUE.search(value):
                    return permanent(
                        f"header {name!r} cannot be carried by NATS (no ':', spaces or line "
                        "breaks in names, no line breaks in values)",
                        env,
                        dest,
                    )
        # The server's max_payload counts headers too ("NATS/1.0\r\n", "name: value\r\n"
        # per header, "\r\n"); exceeding it closes the connection.
        header_bytes = 12 + len(names.encode()) + len(values.encode()) + 4 * len(headers)
        limit = self.features.max_payload_bytes - header_bytes
        return check_size(env, dest, limit, "NATS server (max_payload minus headers)")

    def _classify(self, env: Envelope, dest: str, exc: BaseException) -> PublishError:
        errors = require("nats.errors", "nats")
        js_errors = require("nats.js.errors", "nats")
        if isinstance(
            exc,
            errors.ConnectionClosedError
            | errors.ConnectionReconnectingError
            | errors.OutboundBufferLimitError,
        ):
            return unreachable(f"not connected to NATS ({type(exc).__name__})", env, dest, exc)
        if isinstance(exc, errors.MaxPayloadError):
            return permanent("payload exceeds the NATS server's max_payload", env, dest, exc)
        if isinstance(exc, errors.BadSubjectError | errors.BadHeaderError):
            return permanent(f"invalid NATS subject or header ({exc!r})", env, dest, exc)
        if isinstance(exc, js_errors.NoStreamResponseError):
            # A configuration to fix (or, briefly, a stream's leader being elected): this
            # subject's topic is paused with backoff, the others flow, nothing is dead-lettered.
            return unavailable(
                f"no JetStream stream answered for subject {dest!r}: create a stream whose "
                "subjects cover it, or map the topic to a covered subject (destinations)",
                env,
                dest,
                exc,
            )
        if isinstance(exc, js_errors.APIError) and 400 <= (exc.code or 0) < 500:
            return permanent(f"JetStream rejected the message: {exc.description}", env, dest, exc)
        return retryable(f"{type(exc).__name__}: {exc}", env, dest, exc)


def _unreachable(servers: Sequence[str], exc: BaseException) -> BaseException:
    from relay.exceptions import BrokerUnreachableError

    return BrokerUnreachableError(
        f"cannot connect to NATS at {redact(', '.join(servers))}: {type(exc).__name__}: "
        f"{redact(exc)} (is the server running and the URL right?)",
        servers=[redact(s) for s in servers],
    )


def _config_error(message: str) -> BaseException:
    from outbox.exceptions import ConfigurationError

    return ConfigurationError(message)
