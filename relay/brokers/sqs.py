"""Amazon SQS and SNS adapters (boto3): ``SendMessageBatch`` / ``PublishBatch``, ten messages a
call, several calls in flight; a message is confirmed only when the call lists it ``Successful``.

Destinations: ``destinations`` (topic -> destination), else ``default_destination`` (a
template: ``{topic}.fifo``), else the topic itself; each an SQS queue's name (looked up once
with ``GetQueueUrl``) or its URL, or an SNS topic's ARN or name (its ARN is built from the
caller's account, ``GetCallerIdentity``). A name ending in ``.fifo`` is a FIFO queue or
topic: each message carries ``MessageGroupId`` (from the key) and ``MessageDeduplicationId``
(the outbox id), and SQS drops a repeat of an id within five minutes. The mapping is
:mod:`outbox.wire.sqs`.

Order: the messages of one destination are spread over ``concurrency`` lanes by their group
(the key), and each lane sends its calls one after the other, each only once the previous one
returned. So a key's messages reach the queue in order, and when one of them fails, the key's
later messages in the batch are not sent at all (NotSentError: released untried).

Each call has one HTTP attempt (botocore's retries are off: the relay retries), bounded by
``call_timeout``; a lane starts no call that could end after ``timeout``. Credentials come from
AWS's default chain (environment, shared files, SSO, container or instance role), read by
boto3, never by this module, and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError, InvalidMessageError
from outbox.kit import redact, require
from outbox.wire import sqs as wire
from outbox.wire.cloudevents import CloudEvents
from relay.brokers._batch import (
    Batch,
    PublishError,
    permanent,
    retryable,
    unavailable,
    unreachable,
)
from relay.brokers.base import DEFAULT_ACK_TIMEOUT, BrokerFeatures, Destinations
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationUnavailableError,
    NotSentError,
    PermanentPublishError,
)

__all__ = ["SnsPublisher", "SqsPublisher"]

log = logging.getLogger("relay.brokers.sqs")

#: entries per SendMessageBatch / PublishBatch call (the APIs' limit)
MAX_ENTRIES = 10
#: the size both services accept everywhere (SQS queues may allow up to 1 MiB)
DEFAULT_MAX_BYTES = 256 * 1024
#: SQS FIFO and SNS FIFO drop a repeated MessageDeduplicationId within this many seconds
DEDUP_WINDOW = 300.0
#: error codes that mean the caller's credentials were refused: nothing will go anywhere
_CREDENTIALS = frozenset({
    "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
    "ExpiredToken", "ExpiredTokenException", "MissingAuthenticationToken", "InvalidSecurity",
    "IncompleteSignature", "RequestExpired", "InvalidAccessKeyId", "AuthFailure",
})  # fmt: skip
#: error codes about the destination (missing, or not allowed): the topic waits until fixed
_DESTINATION = frozenset({
    "AccessDenied", "AccessDeniedException", "AuthorizationError", "NotFound",
    "NotFoundException", "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue",
    "NonExistentQueue", "QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently",
    "InvalidAddress", "EndpointDisabled",
})  # fmt: skip
#: error codes that say "later": throttling and the service's own failures
_LATER = frozenset({
    "ServiceUnavailable", "InternalError", "InternalFailure", "RequestTimeout",
    "AWS.SimpleQueueService.InternalError", "SlowDown",
})  # fmt: skip


@dataclass(frozen=True)
class _Target:
    """A resolved destination: where to send, and what it accepts."""

    address: str  # queue URL or topic ARN
    fifo: bool
    max_bytes: int


class _AwsPublisher:
    """What the SQS and SNS adapters share: the client, the lanes, the classification."""

    service = "?"
    extra = "aws"

    def __init__(
        self,
        region: str | None = None,
        *,
        destinations: Mapping[str, str] | None = None,
        allowed_destinations: Sequence[str] | None = None,
        default_destination: str | None = None,
        endpoint_url: str | None = None,
        timeout: float = DEFAULT_ACK_TIMEOUT,
        call_timeout: float | None = None,
        connect_timeout: float = 2.0,
        concurrency: int = 16,
        cloudevents: CloudEvents | None = None,
    ) -> None:
        #: the CloudEvents format (outbox.wire.cloudevents), or None: our own
        self._cloudevents = cloudevents
        self._boto3 = require("boto3", self.extra)
        if not isinstance(concurrency, int) or not 1 <= concurrency <= 256:
            raise ConfigurationError(f"concurrency must be 1..256, not {concurrency!r}")
        if not timeout > 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, not {timeout!r}")
        self._region = region
        self._endpoint_url = endpoint_url
        if default_destination is not None:
            destinations = {"*": default_destination, **(destinations or {})}
        self._destination = Destinations(
            destinations, broker=self.service, allow=allowed_destinations
        )
        self._timeout = timeout
        self._call_timeout = min(call_timeout or timeout / 2, timeout)
        self._connect_timeout = min(connect_timeout, self._call_timeout / 2)
        self._concurrency = concurrency
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._calls: asyncio.Semaphore | None = None
        self._targets: dict[str, _Target] = {}
        fifo = _all_fifo(destinations)
        self.features = BrokerFeatures(
            name=self.service,
            dedup_window_seconds=DEDUP_WINDOW if fifo else 0,
            keeps_key_order=fifo,
            headers=True,
            max_payload_bytes=DEFAULT_MAX_BYTES,
            ack_timeout_seconds=timeout,
        )

    # ---- connection -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is not None:
            return
        pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix=f"outbox-{self.service}")
        loop = asyncio.get_running_loop()
        try:
            client = await loop.run_in_executor(pool, self._make_client)
            await asyncio.wait_for(
                loop.run_in_executor(pool, self._probe, client), self._call_timeout + 1
            )
        except Exception as exc:
            pool.shutdown(wait=False, cancel_futures=True)
            raise self._unreachable_error(exc) from exc
        self._client, self._pool = client, pool
        self._calls = asyncio.Semaphore(self._concurrency)

    def _make_client(self) -> Any:
        botocore_config = require("botocore.config", self.extra)
        config = botocore_config.Config(
            connect_timeout=self._connect_timeout,
            read_timeout=max(self._call_timeout - self._connect_timeout, 0.5),
            retries={"total_max_attempts": 1},  # one attempt per call: the relay retries
            max_pool_connections=self._concurrency,
        )
        return self._boto3.session.Session().client(
            self.service, region_name=self._region, endpoint_url=self._endpoint_url, config=config
        )

    def _probe(self, client: Any) -> None:
        """One cheap call: reaches the endpoint and checks the credentials. A refusal of the
        call itself (no permission to list) is fine: the service answered."""
        raise NotImplementedError

    def _unreachable_error(self, exc: BaseException) -> BrokerUnreachableError:
        where = _shown(self._endpoint_url) or f"the {self._region or 'default'} region"
        why = _describe(exc, self._endpoint_url)
        return BrokerUnreachableError(
            f"cannot reach Amazon {self.service.upper()} at {where}: {why} "
            "(is the endpoint right and reachable, and are AWS credentials available to the "
            "default chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, a role?)",
            service=self.service,
        )

    async def close(self) -> None:
        client, pool, self._client, self._pool = self._client, self._pool, None, None
        self._targets.clear()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if client is not None:
            with contextlib.suppress(Exception):  # closing anyway
                client.close()

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        assert self._calls is not None
        assert self._pool is not None
        async with self._calls:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # ---- destinations ---------------------------------------------------------------------

    async def _target(self, dest: str) -> _Target:
        target = self._targets.get(dest)
        if target is None:
            target = self._targets[dest] = await self._resolve(dest)
        return target

    async def _resolve(self, dest: str) -> _Target:
        raise NotImplementedError

    async def check_destination(self, destination: str) -> str:
        """Where ``destination`` resolves (``outbox relay check``; publishes nothing)."""
        from relay.exceptions import DestinationUnavailableError

        await self.start()
        try:
            target = await self._resolve(destination)
        except Exception as exc:
            raise DestinationUnavailableError(f"{self.service} {destination!r}: {exc}") from exc
        return f"{target.address}{' (FIFO)' if target.fifo else ''}"

    # ---- publishing -----------------------------------------------------------------------

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        if self._client is None:
            await self.start()
        batch = Batch(envelopes, self._destination)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        targets: dict[str, _Target | PublishError] = {}
        lanes: dict[tuple[str, int], list[tuple[int, wire.SqsMessage, int]]] = {}
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            target = targets.get(dest)
            if target is None:
                try:
                    target = targets[dest] = await self._target(dest)
                except Exception as exc:
                    target = targets[dest] = self._classify(env, dest, exc)
            if not isinstance(target, _Target):
                batch.refuse(i, _again(target, env, dest))
                continue
            try:
                message = wire.encode(env, self._cloudevents)
            except InvalidMessageError as exc:
                batch.refuse(i, permanent(str(exc), env, dest))
                continue
            size = wire.size(message)
            if size > target.max_bytes:
                limit = f"{self.service.upper()} limit of {target.max_bytes} bytes"
                reason = f"message of {size} bytes (body and attributes) exceeds the {limit}"
                batch.refuse(i, permanent(reason, env, dest))
                continue
            lane = zlib.crc32(message.group_id.encode()) % self._concurrency
            lanes.setdefault((dest, lane), []).append((i, message, size))
        await asyncio.gather(*(
            self._lane(batch, targets[dest], items, deadline)  # type: ignore[arg-type]
            for (dest, _), items in lanes.items()
        ))  # fmt: skip
        return batch.results

    async def _lane(
        self,
        batch: Batch,
        target: _Target,
        items: list[tuple[int, wire.SqsMessage, int]],
        deadline: float,
    ) -> None:
        """Send ``items`` (one destination, in input order) in calls of up to ten, one call
        after the other; a message whose key failed earlier is not sent."""
        loop = asyncio.get_running_loop()
        pos = 0
        while pos < len(items):
            chunk: list[tuple[int, wire.SqsMessage]] = []
            total = 0
            while pos < len(items) and len(chunk) < MAX_ENTRIES:
                i, message, size = items[pos]
                if chunk and total + size > target.max_bytes:
                    break  # the call's total is limited like one message
                pos += 1
                if not batch.skip_if_blocked(i):
                    chunk.append((i, message))
                    total += size
            if not chunk:
                continue
            if loop.time() + self._call_timeout > deadline:
                rest = [i for i, _ in chunk] + [i for i, _, _ in items[pos:]]
                why = f"not sent: no time left for another call within {self._timeout} s"
                for i in rest:
                    if batch.results[i] is None:
                        env, dest = batch.envelopes[i], batch.destinations[i]
                        batch.results[i] = retryable(why, env, dest, kind=NotSentError)
                return
            await self._send_chunk(batch, target, chunk)

    async def _send_chunk(
        self, batch: Batch, target: _Target, chunk: list[tuple[int, wire.SqsMessage]]
    ) -> None:
        entries = [self._entry(str(i), message, target.fifo) for i, message in chunk]
        try:
            response = await self._call(self._send, target.address, entries)
        except Exception as exc:
            for i, _ in chunk:
                batch.refuse(i, self._classify(batch.envelopes[i], batch.destinations[i], exc))
            return
        confirmed = {entry.get("Id") for entry in response.get("Successful") or ()}
        failed = {entry.get("Id"): entry for entry in response.get("Failed") or ()}
        for i, _ in chunk:
            env, dest = batch.envelopes[i], batch.destinations[i]
            if str(i) in confirmed:
                continue
            entry = failed.get(str(i))
            if entry is None:
                err: PublishError = retryable("the service did not confirm the message", env, dest)
            else:
                err = self._classify_code(
                    env, dest, str(entry.get("Code")), str(entry.get("Message")),
                    sender_fault=bool(entry.get("SenderFault")),
                )  # fmt: skip
            batch.refuse(i, err)

    def _entry(self, entry_id: str, message: wire.SqsMessage, fifo: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _send(self, address: str, entries: list[dict[str, Any]]) -> Any:
        raise NotImplementedError

    # ---- errors ---------------------------------------------------------------------------

    def _classify(self, env: Envelope, dest: str, exc: BaseException) -> PublishError:
        response = getattr(exc, "response", None)
        if isinstance(response, Mapping) and isinstance(response.get("Error"), Mapping):
            error = response["Error"]
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            return self._classify_code(
                env, dest, str(error.get("Code")), str(error.get("Message")),
                sender_fault=isinstance(status, int) and 400 <= status < 500,
                cause=exc,
            )  # fmt: skip
        # no answer from the service (connection refused or lost, timeout, no credentials)
        return unreachable(_describe(exc, self._endpoint_url), env, dest, exc)

    def _classify_code(
        self,
        env: Envelope,
        dest: str,
        code: str,
        message: str,
        *,
        sender_fault: bool,
        cause: BaseException | None = None,
    ) -> PublishError:
        what = f"{self.service.upper()} refused it: {code}: {message}"
        lowered = code.lower()
        if code in _CREDENTIALS:
            return unreachable(
                f"{what} (the AWS credentials were refused: fix them where the default chain "
                "finds them)", env, dest, cause)  # fmt: skip
        if "throttl" in lowered or code in _LATER:
            return retryable(what, env, dest, cause)
        if code in _DESTINATION or lowered.startswith("kms"):
            return unavailable(
                f"{what} (create the {self._noun()} {dest!r}, or grant the relay's AWS "
                f"identity {self.service}:{self._action()} on it and its KMS key)",
                env, dest, cause)  # fmt: skip
        if sender_fault:
            return permanent(what, env, dest, cause)
        return retryable(what, env, dest, cause)

    def _noun(self) -> str:
        return "queue"

    def _action(self) -> str:
        return "SendMessage"


class SqsPublisher(_AwsPublisher):
    """Sends to Amazon SQS queues (FIFO and standard)."""

    service = "sqs"

    def _probe(self, client: Any) -> None:
        _answered(client.list_queues, {"MaxResults": 1})

    async def _resolve(self, dest: str) -> _Target:
        if dest.startswith(("https://", "http://")):
            url = dest
        else:
            url = (await self._call(self._client.get_queue_url, QueueName=dest))["QueueUrl"]
        name = url.rstrip("/").rpartition("/")[2]
        fifo, max_bytes = name.endswith(".fifo"), DEFAULT_MAX_BYTES
        try:
            attributes = (await self._call(
                self._client.get_queue_attributes, QueueUrl=url,
                AttributeNames=["FifoQueue", "MaximumMessageSize"],
            ))["Attributes"]  # fmt: skip
            fifo = attributes.get("FifoQueue") == "true"
            max_bytes = int(attributes.get("MaximumMessageSize", max_bytes))
        except Exception as exc:  # no sqs:GetQueueAttributes: the name and 256 KiB it is
            if not _refused(exc):
                raise
        return _Target(url, fifo, max_bytes)

    def _entry(self, entry_id: str, message: wire.SqsMessage, fifo: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"Id": entry_id, "MessageBody": message.body,
                                 "MessageAttributes": message.attributes}  # fmt: skip
        if fifo:
            entry["MessageGroupId"] = message.group_id
            entry["MessageDeduplicationId"] = message.deduplication_id
        return entry

    def _send(self, address: str, entries: list[dict[str, Any]]) -> Any:
        return self._client.send_message_batch(QueueUrl=address, Entries=entries)


class SnsPublisher(_AwsPublisher):
    """Publishes to Amazon SNS topics (FIFO and standard); consumers read SQS queues
    subscribed to them with ``RawMessageDelivery=true``."""

    service = "sns"
    #: ``arn:PARTITION:sns:REGION:ACCOUNT:``, for topics given by name (from GetCallerIdentity)
    _arn_prefix: str | None = None

    def _probe(self, client: Any) -> None:
        _answered(client.list_topics, {})

    async def _resolve(self, dest: str) -> _Target:
        if dest.startswith("arn:"):
            arn = dest
        else:
            if self._arn_prefix is None:
                sts = await self._call(self._sts_client)
                identity = await self._call(sts.get_caller_identity)
                partition = str(identity["Arn"]).split(":")[1]
                region = self._client.meta.region_name
                self._arn_prefix = f"arn:{partition}:sns:{region}:{identity['Account']}:"
            arn = self._arn_prefix + dest
        attributes = (await self._call(self._client.get_topic_attributes, TopicArn=arn))[
            "Attributes"
        ]
        fifo = attributes.get("FifoTopic") == "true" or arn.endswith(".fifo")
        return _Target(arn, fifo, DEFAULT_MAX_BYTES)

    def _sts_client(self) -> Any:
        return self._boto3.session.Session().client(
            "sts", region_name=self._client.meta.region_name, endpoint_url=self._endpoint_url
        )

    def _entry(self, entry_id: str, message: wire.SqsMessage, fifo: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"Id": entry_id, "Message": message.body,
                                 "MessageAttributes": message.attributes}  # fmt: skip
        if fifo:
            entry["MessageGroupId"] = message.group_id
            entry["MessageDeduplicationId"] = message.deduplication_id
        return entry

    def _send(self, address: str, entries: list[dict[str, Any]]) -> Any:
        return self._client.publish_batch(TopicArn=address, PublishBatchRequestEntries=entries)

    def _noun(self) -> str:
        return "topic"

    def _action(self) -> str:
        return "Publish"


def _all_fifo(destinations: Mapping[str, str] | None) -> bool:
    """Every destination is a FIFO queue or topic (by name): order and dedup are the broker's."""
    values = list((destinations or {}).values())
    return bool(values) and all(v.endswith(".fifo") for v in values)


def _again(error: PublishError, env: Envelope, dest: str) -> PublishError:
    """The error of a destination that could not be resolved, for one of its messages."""
    reason, cause = str(getattr(error, "reason", error)), error.__cause__
    if isinstance(error, BrokerUnreachableError):
        return unreachable(reason, env, dest, cause)
    if isinstance(error, DestinationUnavailableError | PermanentPublishError):
        # a name the service refuses is the topic's configuration, not the message's fault
        return unavailable(reason, env, dest, cause)
    return retryable(reason, env, dest, cause)


def _answered(call: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    """Run ``call``; a refusal for lack of permission still proves the endpoint and the
    credentials work, anything else raises."""
    try:
        call(**kwargs)
    except Exception as exc:
        if not _refused(exc):
            raise


def _refused(exc: BaseException) -> bool:
    """The service answered with a permission refusal (not a credentials one)."""
    response = getattr(exc, "response", None) or {}  # botocore's HTTP errors carry None
    error = response.get("Error") or {}
    return error.get("Code") in ("AccessDenied", "AccessDeniedException", "AuthorizationError")


def _shown(url: str | None) -> str | None:
    """``url`` as an error may show it: scheme, host and path, never a user or a query."""
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}" + (
        parts.path
    )


def _describe(exc: BaseException, endpoint: str | None) -> str:
    """What went wrong. botocore's messages name the operation and the endpoint URL (never the
    AWS credentials): an endpoint given with a user or a query is shown without them."""
    text = f"{type(exc).__name__}: {exc}"
    if endpoint:
        text = text.replace(endpoint, _shown(endpoint) or "")
    return redact(text)  # the project's one redactor: any other URL's user-info or secret
