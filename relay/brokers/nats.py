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
import itertools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.envelope import Envelope
from outbox.kit import redact, require
from outbox.wire import nats as wire
from outbox.wire.cloudevents import CloudEvents
from relay.brokers._batch import (
    Batch,
    PublishError,
    check_size,
    permanent,
    retryable,
    unavailable,
    unreachable,
)
from relay.brokers.base import (
    DEFAULT_ACK_TIMEOUT,
    BrokerFeatures,
    Destinations,
    nats_subject_matches,
)

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
        partitions: Mapping[str, int] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        stream: str | None = None,
        stream_subjects: Sequence[str] | None = None,
        create_stream: bool = False,
        duplicate_window: float = DEFAULT_DUPLICATE_WINDOW,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        connect_timeout: float = 5.0,
        max_in_flight: int = 4000,
        connect_options: Mapping[str, Any] | None = None,
        cloudevents: CloudEvents | None = None,
    ) -> None:
        #: the CloudEvents format (outbox.wire.cloudevents), or None: our own
        self._cloudevents = cloudevents
        self._nats = require("nats", "nats")
        self._servers = [servers] if isinstance(servers, str) else list(servers)
        self._destination = Destinations(
            destinations,
            broker="nats",
            allow=allowed_destinations
            if allowed_destinations is not None
            else (list(stream_subjects) if stream_subjects else None),
            matches=nats_subject_matches,
            partitions=partitions,
        )
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
        #: rate limit of the connection-error warnings (see :meth:`_on_error`)
        self._error_spacing, self._next_error_log, self._errors_unlogged = 0.0, 0.0, 0
        self._js: Any = None
        #: the batch path's own PubAck inbox (see :meth:`_publish_frames`): its subject prefix,
        #: and the futures of the publishes not acknowledged yet, by reply token
        self._reply_prefix = ""
        self._acks: dict[str, asyncio.Future[None]] = {}
        self._tokens = itertools.count()
        #: header names and subjects already found valid (they repeat from message to message)
        self._good_names: set[str] = set()
        self._good_subjects: set[str] = set()
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
        self._error_spacing, self._next_error_log, self._errors_unlogged = 0.0, 0.0, 0
        self._js = nc.jetstream(
            timeout=self._timeout, publish_async_max_pending=self._max_in_flight
        )
        self._acks = {}
        self._reply_prefix = ""
        if _frames_supported(nc):
            prefix = nc.new_inbox()
            await nc.subscribe(f"{prefix}.*", cb=self._on_ack)
            self._reply_prefix = f"{prefix}."
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
            "reconnected_cb": self._on_reconnected,
            **self._connect_options,
        }
        # The first connection fails at once with its reason (nats-py would otherwise retry it
        # every reconnect_time_wait, forever, logging each attempt); the relay retries start()
        # with its own backoff. Once connected, nats-py reconnects underneath as configured.
        await _any_server_answers(self._servers, self._connect_timeout)
        reconnect = options["allow_reconnect"]
        nc = await self._nats.connect(
            servers=self._servers, **{**options, "allow_reconnect": False}
        )
        nc.options["allow_reconnect"] = reconnect
        return nc

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

    async def check_destination(self, destination: str) -> str:
        """Which stream stores ``destination`` (``outbox relay check``; publishes nothing).
        Raises DestinationUnavailableError when no stream's subjects cover it."""
        from relay.exceptions import DestinationUnavailableError

        js_errors = require("nats.js.errors", "nats")
        if self._js is None:
            await self.start()
        try:
            name = await self._js.find_stream_name_by_subject(destination)
        except js_errors.NotFoundError:
            raise DestinationUnavailableError(
                f"no JetStream stream covers subject {destination!r}: create a stream whose "
                "subjects cover it ([broker] stream, stream_subjects, create_stream = true), "
                "or map the topic to a covered subject ([broker.destinations])"
            ) from None
        return f"stream {name}"

    async def _on_error(self, exc: Exception) -> None:
        # While nats-py reconnects it reports each failed attempt (two a second): log the
        # first, then with growing spacing (1, 2, 4 ... 60 s), with how many were not shown.
        self._last_error = exc
        now = asyncio.get_running_loop().time()
        self._errors_unlogged += 1
        if now < self._next_error_log:
            return
        more = self._errors_unlogged - 1
        log.warning("NATS connection error: %s%s", redact(exc),
                    f" ({more} more since the last report)" if more else "")  # fmt: skip
        self._errors_unlogged = 0
        self._error_spacing = min(max(self._error_spacing * 2, 1.0), 60.0)
        self._next_error_log = now + self._error_spacing

    async def _on_reconnected(self) -> None:
        if self._error_spacing:
            log.warning("NATS connection re-established")
        self._error_spacing, self._next_error_log, self._errors_unlogged = 0.0, 0.0, 0

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
        if self._reply_prefix:
            pending = await self._publish_frames(nc, batch)
        else:
            pending = await self._publish_async(batch)
        deadline = asyncio.get_running_loop().time() + self._timeout
        try:
            await batch.settle(
                pending,
                max(0.0, deadline - asyncio.get_running_loop().time()),
                lambda i, exc: self._classify(envelopes[i], batch.destinations[i], exc),
                "PubAck",
            )
        finally:
            if self._reply_prefix:
                for fut in pending.values():  # timed out or cancelled: forget their tokens
                    if not fut.done():
                        fut.cancel()
        if not nc.is_connected:
            batch.connection_lost(list(pending), "NATS connection lost")
        return batch.results

    async def _publish_frames(self, nc: Any, batch: Batch) -> dict[int, asyncio.Future[Any]]:
        """Hand the batch to the connection as protocol frames, in input order, in as few
        writes as ``max_in_flight`` allows; the futures of the PubAcks, by index.

        nats-py's ``publish_async`` costs a semaphore wait, a task-free timeout, a token and a
        header encoding per message, as much as the rest of the relay's work on a message; here
        each message is one ``HPUB`` frame, headers encoded in one join, and the PubAcks arrive
        on one inbox subscription (:meth:`_on_ack`). What the client would refuse (a bad
        subject or header name, a payload over max_payload) is refused the same way first.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        pending: dict[int, asyncio.Future[Any]] = {}
        frames: list[bytes] = []
        acks, prefix, tokens = self._acks, self._reply_prefix, self._tokens
        room = self._max_in_flight - len(acks)
        for i, env, dest in batch.items():
            if batch.blocking and batch.skip_if_blocked(i):
                continue
            message = wire.encode(env, self._cloudevents)
            headers = message.headers
            err = self._refusal(env, dest, headers) or self._invalid(env, dest, headers)
            if err is None and room <= 0:
                await self._write(nc, frames)
                frames = []
                err = await self._room(env, dest, pending, deadline)
                room = self._max_in_flight - len(acks)
            if err is not None:
                batch.refuse(i, err)
                continue
            token = str(next(tokens))
            pending[i] = acks[token] = loop.create_future()
            room -= 1
            parts = ["NATS/1.0\r\n"]
            for name, value in headers.items():
                if name:
                    parts += (name, ": ", value.strip(), "\r\n")
            parts.append("\r\n")
            head = "".join(parts).encode()
            data = message.data
            frames.append(
                f"HPUB {dest} {prefix}{token} {len(head)} {len(head) + len(data)}\r\n".encode()
                + head
                + data
                + b"\r\n"
            )
        await self._write(nc, frames)
        return pending

    async def _write(self, nc: Any, frames: list[bytes]) -> None:
        """One write of the frames (nats-py's own buffer and flusher carry it)."""
        if not frames:
            return
        out = b"".join(frames)
        nc.stats["out_msgs"] += len(frames)
        nc.stats["out_bytes"] += len(out)
        await nc._send_command(out)
        queue = getattr(nc, "_flush_queue", None)
        if queue is not None and queue.empty():  # as the client's publish: one kick is enough
            await nc._flush_pending()

    async def _on_ack(self, msg: Any) -> None:
        """A PubAck (or the server's refusal) for a publish of :meth:`_publish_frames`."""
        fut = self._acks.pop(msg.subject[len(self._reply_prefix) :], None)
        if fut is None or fut.done():
            return  # timed out already (its batch released it), or not ours
        if msg.headers and msg.headers.get("Status") == "503":  # no stream for the subject
            fut.set_exception(require("nats.js.errors", "nats").NoStreamResponseError())
            return
        data = msg.data
        if b'"error"' in data:
            error = _api_error(data)
            if error is not None:
                fut.set_exception(error)
                return
        fut.set_result(None)

    def _invalid(self, env: Envelope, dest: str, headers: Mapping[str, str]) -> PublishError | None:
        """What nats-py's publish would raise for the subject or a header name (checked once
        per distinct name or subject)."""
        if dest not in self._good_subjects:
            if not dest or _BAD_SUBJECT.search(dest):
                return permanent(f"invalid NATS subject {dest!r}", env, dest)
            self._good_subjects.add(dest)
        good = self._good_names
        for name in headers:
            if name not in good:
                if name and not _HEADER_NAME.fullmatch(name):
                    return permanent(f"invalid NATS header name {name!r}", env, dest)
                good.add(name)
        return None

    async def _publish_async(self, batch: Batch) -> dict[int, asyncio.Future[Any]]:
        """The batch through nats-py's ``publish_async`` (a client without the frame path)."""
        pending: dict[int, asyncio.Future[Any]] = {}
        deadline = asyncio.get_running_loop().time() + self._timeout
        publish = self._js.publish_async
        # publishes that fit before max_in_flight is reached: the pending count is read again
        # (and waited on) only when they are used up, not per message
        room = self._max_in_flight - self._js.publish_async_pending()
        for i, env, dest in batch.items():
            if batch.blocking and batch.skip_if_blocked(i):
                continue
            message = wire.encode(env, self._cloudevents)
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
        return pending

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
        while self._in_flight() >= self._max_in_flight:
            waiting = [f for f in pending.values() if not f.done()][:1]
            remaining = deadline - asyncio.get_running_loop().time()
            if not waiting or remaining <= 0:
                return retryable(f"{self._max_in_flight} publishes still unacked", env, dest)
            await asyncio.wait(waiting, timeout=remaining)
        return None

    def _in_flight(self) -> int:
        """Publishes sent and not acknowledged yet."""
        if self._reply_prefix:
            return len(self._acks)
        return int(self._js.publish_async_pending())

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


#: what nats-py accepts in a header name, and refuses in a published subject
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_SUBJECT = re.compile(r"[\s\x00]")


def _frames_supported(nc: Any) -> bool:
    """The client has the internals the frame path writes through (nats-py 2.x)."""
    return (
        callable(getattr(nc, "_send_command", None))
        and callable(getattr(nc, "_flush_pending", None))
        and isinstance(getattr(nc, "stats", None), dict)
    )


def _api_error(data: bytes) -> BaseException | None:
    """The JetStream error in a PubAck's body, as nats-py raises it; None when it is an ack."""
    js_errors = require("nats.js.errors", "nats")
    error: BaseException
    try:
        body = json.loads(data)
    except ValueError as exc:
        error = js_errors.APIError(description=f"unreadable PubAck: {exc}")
        return error
    if not isinstance(body, dict) or "error" not in body:
        return None
    try:
        js_errors.APIError.from_error(body["error"])  # raises the error's own class
        error = js_errors.APIError(description="JetStream error")
    except js_errors.APIError as exc:
        error = exc
    except Exception as exc:  # a malformed error object
        error = js_errors.APIError(description=f"unreadable PubAck error: {exc}")
    return error


def _unreachable(servers: Sequence[str], exc: BaseException) -> BaseException:
    from relay.exceptions import BrokerUnreachableError

    return BrokerUnreachableError(
        f"cannot connect to NATS at {redact(', '.join(servers))}: {type(exc).__name__}: "
        f"{redact(exc) or 'no answer within connect_timeout'} (is the server running and the "
        "URL right?)",
        servers=[redact(s) for s in servers],
    )


async def _any_server_answers(servers: Sequence[str], within: float) -> None:
    """Return once one server accepts a TCP connection; raise the last refusal otherwise."""
    from urllib.parse import urlsplit

    last: BaseException | None = None
    for server in servers:
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        if parts.scheme not in ("nats", "tls"):  # websockets: let nats-py connect
            return
        try:
            async with asyncio.timeout(within):
                _, writer = await asyncio.open_connection(parts.hostname, parts.port or 4222)
        except (OSError, TimeoutError) as exc:
            last = exc if str(exc) else TimeoutError(f"no answer within {within:g}s")
            continue
        writer.close()
        return
    if last is not None:
        raise last


def _config_error(message: str) -> BaseException:
    from outbox.exceptions import ConfigurationError

    return ConfigurationError(message)
