"""Redis Streams adapter (redis.asyncio): one pipelined round trip of ``XADD`` per batch.

Fields of each entry: the envelope headers plus ``payload`` (the body). Redis runs a pipeline's
commands one after the other on one connection, so the stream holds them in input order; the
reply to each ``XADD`` (the entry id, or an error) is its acknowledgement. Redis before 8.6 has
no producer dedup: re-sent ids land twice and the consumer's inbox drops the second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.kit import redact, require
from outbox.wire import redis as wire
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

__all__ = ["RedisPublisher"]

DEFAULT_MAX_BULK = 512 * 1024 * 1024  # proto-max-bulk-len
#: error replies that say "later", not "never"
_TRANSIENT_PREFIXES = ("OOM", "LOADING", "BUSY", "READONLY", "MASTERDOWN", "TRYAGAIN",
                       "CLUSTERDOWN", "NOREPLICAS", "MOVED", "ASK")  # fmt: skip
#: error replies about the destination key, not the message: the topic waits until fixed
_DESTINATION_PREFIXES = ("WRONGTYPE", "NOPERM")


class RedisPublisher:
    """Appends to Redis streams; optional approximate ``MAXLEN ~`` trimming."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        destinations: Mapping[str, str] | None = None,
        partitions: Mapping[str, int] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        maxlen: int | None = None,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        connect_timeout: float = 5.0,
        max_payload_bytes: int = DEFAULT_MAX_BULK,
        cloudevents: CloudEvents | None = None,
    ) -> None:
        #: the CloudEvents format (outbox.wire.cloudevents), or None: our own
        self._cloudevents = cloudevents
        self._redis = require("redis.asyncio", "redis")
        self._url = url
        self._destination = Destinations(
            destinations, broker="redis", allow=allowed_destinations, partitions=partitions
        )
        self._maxlen = maxlen
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._client: Any = None
        self.features = BrokerFeatures(
            name="redis",
            dedup_window_seconds=0,
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=max_payload_bytes,
            ack_timeout_seconds=timeout,
        )

    async def start(self) -> None:
        if self._client is not None:
            return
        client = self._redis.Redis.from_url(
            self._url,
            socket_timeout=self._timeout,
            socket_connect_timeout=self._connect_timeout,
        )
        try:
            await asyncio.wait_for(client.ping(), self._connect_timeout + 1)
        except Exception as exc:
            await client.aclose()
            raise RetryablePublishError(
                f"cannot connect to Redis at {redact(self._url)}: {type(exc).__name__}: "
                f"{redact(exc)} (is the server running and the URL right?)",
                url=redact(self._url),
            ) from exc
        self._client = client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        await self.start()
        batch = Batch(envelopes, self._destination)
        sent: list[int] = []
        pipe = self._client.pipeline(transaction=False)
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            try:
                fields = wire.encode(env, self._cloudevents)
            except InvalidMessageError as exc:
                batch.refuse(i, permanent(str(exc), env, dest))
                continue
            err = check_size(env, dest, self.features.max_payload_bytes, "Redis")
            if err is not None:
                batch.refuse(i, err)
                continue
            pipe.xadd(dest, fields, maxlen=self._maxlen, approximate=True)
            sent.append(i)
        if not sent:
            return batch.results
        try:
            async with asyncio.timeout(self._timeout):
                replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            # the connection broke: some may have been appended; all are retried (at-least-once)
            await self._reset()
            error: BaseException = exc
            batch.fail_all(
                sent, lambda i: self._classify(envelopes[i], batch.destinations[i], error)
            )
            return batch.results
        for i, reply in zip(sent, replies, strict=True):
            if isinstance(reply, BaseException):
                batch.results[i] = self._classify(envelopes[i], batch.destinations[i], reply)
        return batch.results

    async def _reset(self) -> None:
        try:
            await self.close()
        except Exception:  # the connection is already broken; a fresh one is made next batch
            self._client = None

    def _classify(self, env: Envelope, dest: str, exc: BaseException) -> PublishError:
        exceptions = require("redis.exceptions", "redis")
        if isinstance(exc, exceptions.ResponseError) and str(exc).startswith(_DESTINATION_PREFIXES):
            # the key is not a stream, or this user may not write it: a configuration to fix
            return unavailable(
                f"Redis refused XADD to {dest!r}: {exc} (use a key that is a stream, or grant "
                "the relay's user XADD on it)",
                env,
                dest,
                exc,
            )
        if isinstance(exc, exceptions.ResponseError) and not str(exc).startswith(
            _TRANSIENT_PREFIXES
        ):
            return permanent(f"Redis refused XADD: {exc}", env, dest, exc)
        return retryable(f"{type(exc).__name__}: {exc}", env, dest, exc)
