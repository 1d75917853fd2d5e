"""The relay's side: RPUSH each message onto its destination list, in order, in one pipeline
per batch; the reply of each command is that message's acknowledgement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outbox.brokers import BrokerFeatures
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from outbox_redis_list import wire
from relay.brokers import Destinations
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationUnavailableError,
    NotSentError,
    PermanentPublishError,
    RetryablePublishError,
)

__all__ = ["ListPublisher", "parse_url"]


def parse_url(url: str) -> tuple[list[Any], dict[str, Any]]:
    """``redis-list://host:port/db`` -> the Redis URL, the publisher's one argument."""
    scheme, sep, rest = url.partition("://")
    if not sep or not rest:
        raise ConfigurationError(f"{scheme} URL needs the form redis-list://host:port/db")
    return [f"redis://{rest}"], {}


class ListPublisher:
    """Appends each message to the list its topic maps to (``destinations``)."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        destinations: Mapping[str, str] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        max_payload_bytes: int = 512 * 1024 * 1024,
        timeout: float = 8.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self._url, self._timeout, self._connect_timeout = url, timeout, connect_timeout
        self._destinations = Destinations(
            destinations, broker="redis-list", allow=allowed_destinations
        )
        self._client: Any = None
        self.features = BrokerFeatures(
            name="redis-list", dedup_window_seconds=0, keeps_key_order=True, headers=True,
            max_payload_bytes=max_payload_bytes, ack_timeout_seconds=timeout,
        )  # fmt: skip

    async def start(self) -> None:
        import redis.asyncio
        from redis.exceptions import RedisError

        await self.close()
        client = redis.asyncio.Redis.from_url(
            self._url, socket_timeout=self._timeout, socket_connect_timeout=self._connect_timeout
        )
        try:
            await client.ping()
        except (RedisError, OSError) as exc:
            await client.aclose()
            raise BrokerUnreachableError(f"cannot connect to Redis: {exc}") from None
        self._client = client

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        if self._client is None:
            raise BrokerUnreachableError("not connected to Redis: call start() first")
        results: list[BaseException | None] = [None] * len(envelopes)
        held: dict[str, str] = {}  # key -> the id of its refused message
        pipe = self._client.pipeline(transaction=False)
        sent: list[int] = []
        for i, env in enumerate(envelopes):
            refused = self._refusal(env, held)
            if refused is not None:
                results[i] = refused
                continue
            pipe.rpush(self._destinations(env.topic), wire.encode(env))
            sent.append(i)
        if sent:
            replies = await self._execute(pipe, len(sent))
            for i, reply in zip(sent, replies, strict=True):
                results[i] = self._outcome(envelopes[i], reply)
        return results

    def _refusal(self, env: Envelope, held: dict[str, str]) -> BaseException | None:
        if env.key in held:
            return NotSentError(f"message {env.id} not sent: message {held[env.key]} of its "
                                "key was refused in this batch")  # fmt: skip
        try:
            self._destinations(env.topic)
        except DestinationUnavailableError as exc:
            return exc
        if len(env.payload) > self.features.max_payload_bytes:
            held[env.key] = str(env.id)
            return PermanentPublishError(
                f"message {env.id} is {len(env.payload)} bytes, above the maximum of "
                f"{self.features.max_payload_bytes}"
            )
        return None

    async def _execute(self, pipe: Any, n: int) -> list[Any]:
        from redis.exceptions import RedisError

        try:
            return list(await pipe.execute(raise_on_error=False))
        except (RedisError, OSError) as exc:
            error = RetryablePublishError(f"Redis did not answer: {exc}")
            return [error] * n

    @staticmethod
    def _outcome(env: Envelope, reply: Any) -> BaseException | None:
        if not isinstance(reply, BaseException):
            return None
        if str(reply).startswith(("WRONGTYPE", "NOPERM")):
            return DestinationUnavailableError(f"message {env.id}: the destination refuses "
                                               f"it: {reply}")  # fmt: skip
        return RetryablePublishError(f"message {env.id} not confirmed: {reply}")

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
