"""Amazon SQS consumer (boto3): delete after commit, redelivery through the visibility timeout.

SNS is consumed through an SQS queue subscribed to the topic with ``RawMessageDelivery=true``
(without it, SNS wraps the message in a JSON notification that is not an outbox message).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from inbox._claimcheck import ClaimCheckResolver
from inbox._consumer import Batching, BrokerConsumer, Delivery, ResultCallback
from inbox._runner import AsyncHandlerRunner, Result
from outbox.exceptions import ConfigurationError
from outbox.kit import require
from outbox.wire import sqs as wire

__all__ = ["SqsConsumer"]

log = logging.getLogger("inbox.consumer")

#: ``//user:password@`` in a URL (error paths only)
_USERINFO = re.compile(r"//[^/@\s]+@")
_MAX_ENTRIES = 10  # per ReceiveMessage, DeleteMessageBatch, ChangeMessageVisibilityBatch


class SqsConsumer(BrokerConsumer):
    """Receive from ``queue`` (a name or a queue URL), long polling ``wait_seconds`` at a time.

    A message is deleted (``DeleteMessageBatch``) only after its transaction committed. While
    the consumer holds a message (buffered, or its batch being applied), its visibility timeout
    is extended every third of ``visibility_timeout``, so a slow batch is not handed to another
    consumer meanwhile; a crashed consumer's messages come back after ``visibility_timeout``.
    A failed or out-of-order message is made visible again (``ChangeMessageVisibility`` to 0)
    after ``redeliver_delay=``. A message that is not an outbox message is
    recorded dead (when its id can be read) and deleted. Poison messages are the inbox's
    (``max_attempts``, ``on_dead``): give the queue no redrive policy, or a ``maxReceiveCount``
    well above ``max_attempts``, or SQS moves them away before the inbox records them.

    On a FIFO queue one message group (one key) is handed out only while none of its messages
    is held, so each key arrives in order; several ``receivers`` poll side by side.
    Credentials and the region come from AWS's default chain; ``endpoint_url`` points at a
    local or private endpoint.
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        queue: str,
        region: str | None = None,
        endpoint_url: str | None = None,
        wait_seconds: int = 5,
        visibility_timeout: int = 30,
        receivers: int = 1,
        redeliver_delay: float = 1.0,
        on_result: ResultCallback | None = None,
        batching: Batching | None = None,
        claim_check: ClaimCheckResolver | None = None,
    ) -> None:
        require("boto3", "aws")  # fail at construction, naming the extra
        super().__init__(
            runner,
            redeliver_delay=redeliver_delay,
            on_result=on_result,
            batching=batching,
            claim_check=claim_check,
        )
        if not isinstance(wait_seconds, int) or not 0 <= wait_seconds <= 20:
            raise ConfigurationError(f"wait_seconds must be 0..20 (SQS), not {wait_seconds!r}")
        if not isinstance(visibility_timeout, int) or not 3 <= visibility_timeout <= 43200:
            raise ConfigurationError(
                f"visibility_timeout must be 3..43200 seconds, not {visibility_timeout!r}"
            )
        if not isinstance(receivers, int) or not 1 <= receivers <= 64:
            raise ConfigurationError(f"receivers must be 1..64, not {receivers!r}")
        self.queue, self.region, self.endpoint_url = queue, region, endpoint_url
        self.wait_seconds, self.visibility_timeout = wait_seconds, visibility_timeout
        self.receivers = receivers
        #: received and not yet settled: receipt handle -> when its visibility was last set
        self._held: dict[str, float] = {}
        self._deletes: list[str] = []
        self._delete_wanted = asyncio.Event()
        self._client: Any = None
        self._url = ""
        self._pool: ThreadPoolExecutor | None = None

    def _why(self, exc: BaseException) -> str:
        """``exc`` for a log line: botocore names the endpoint URL, shown without a user or a
        query (it never names the AWS credentials)."""
        text = f"{type(exc).__name__}: {exc}"
        if self.endpoint_url:
            text = text.replace(self.endpoint_url, self.endpoint_url.split("?")[0])
        return _USERINFO.sub("//", text)

    async def _call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, **kwargs))

    async def _consume(self) -> None:
        import boto3
        from botocore.config import Config

        self._pool = ThreadPoolExecutor(self.receivers + 4, thread_name_prefix="inbox-sqs")
        config = Config(
            read_timeout=self.wait_seconds + 10,  # a long poll holds the response that long
            retries={"mode": "standard", "max_attempts": 3},
            max_pool_connections=self.receivers + 4,
        )
        make = functools.partial(boto3.session.Session().client, "sqs", region_name=self.region,
                                 endpoint_url=self.endpoint_url, config=config)  # fmt: skip
        self._client = await self._call(make)
        helpers: list[asyncio.Task[None]] = []
        try:
            self._url = self.queue
            if not self.queue.startswith(("https://", "http://")):
                self._url = (await self._call(self._client.get_queue_url, QueueName=self.queue))[
                    "QueueUrl"
                ]
            helpers = [asyncio.create_task(self._delete_loop()),
                       asyncio.create_task(self._keep_visible())]  # fmt: skip
            self.ready.set()
            await asyncio.gather(*(self._receive_loop() for _ in range(self.receivers)))
        finally:
            await self._finish_workers()
            with contextlib.suppress(Exception):  # best effort: else they return on their own
                await self._flush_deletes()
                await self._release(list(self._held))
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            self._client.close()
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _receive_loop(self) -> None:
        while not self.stopping:
            try:
                response = await self._call(
                    self._client.receive_message,
                    QueueUrl=self._url,
                    MaxNumberOfMessages=_MAX_ENTRIES,
                    WaitTimeSeconds=self.wait_seconds,
                    VisibilityTimeout=self.visibility_timeout,
                    MessageAttributeNames=["All"],
                )
            except Exception as exc:
                if getattr(exc, "response", None) is not None:
                    raise  # the service refused: the queue is gone, no permission...
                log.warning("inbox: SQS receive failed, trying again: %s", self._why(exc))
                await self._wait_stopping(1.0)
                continue
            messages = response.get("Messages") or []
            now = time.monotonic()
            for msg in messages:
                self._held[msg["ReceiptHandle"]] = now
            if self.stopping:
                await self._release([msg["ReceiptHandle"] for msg in messages])
                return
            await self._submit(*(
                Delivery(functools.partial(wire.decode, msg.get("Body"),
                                           msg.get("MessageAttributes")),
                         functools.partial(self._settle, msg["ReceiptHandle"]))
                for msg in messages
            ))  # fmt: skip

    async def _settle(self, receipt: str, result: Result | None) -> None:
        if result is None or result.outcome.ack:
            self._held.pop(receipt, None)
            self._deletes.append(receipt)
            self._delete_wanted.set()
            return
        # Held (its visibility still extended) for redeliver_delay, then visible at once: on a
        # FIFO queue a group is handed out again only when none of its messages is in flight,
        # so the failed message and the later ones of its key come back together, in order.
        await self._wait_stopping(self.redeliver_delay)
        await self._release([receipt])

    # ---- deletes, in batches ------------------------------------------------------------

    async def _delete_loop(self) -> None:
        while True:
            await self._delete_wanted.wait()
            self._delete_wanted.clear()
            await self._flush_deletes()

    async def _flush_deletes(self) -> None:
        while self._deletes:
            taken = self._deletes[: 4 * _MAX_ENTRIES]  # up to four calls side by side
            del self._deletes[: len(taken)]
            chunks = [taken[i : i + _MAX_ENTRIES] for i in range(0, len(taken), _MAX_ENTRIES)]
            await asyncio.gather(*(self._delete(chunk) for chunk in chunks))

    async def _delete(self, receipts: list[str]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)]
        try:
            response = await self._call(
                self._client.delete_message_batch, QueueUrl=self._url, Entries=entries
            )
        except Exception as exc:  # committed, not deleted: redelivered, then a duplicate
            log.warning("inbox: SQS delete of %d messages failed: %s", len(entries), self._why(exc))
            return
        for failed in response.get("Failed") or ():
            log.warning("inbox: SQS did not delete a message (%s: %s); it will come back as a "
                        "duplicate", failed.get("Code"), failed.get("Message"))  # fmt: skip

    # ---- visibility ---------------------------------------------------------------------

    async def _keep_visible(self) -> None:
        """Extend the visibility of the messages held a third of the timeout already."""
        every = self.visibility_timeout / 3
        while True:
            await asyncio.sleep(every / 2)
            due = time.monotonic() - every
            receipts = [r for r, since in list(self._held.items()) if since <= due]
            if receipts:
                await self._set_visibility(receipts, self.visibility_timeout)

    async def _release(self, receipts: list[str]) -> None:
        """Make messages received but not applied visible again at once."""
        for receipt in receipts:
            self._held.pop(receipt, None)
        if receipts:
            await self._set_visibility(receipts, 0)

    async def _set_visibility(self, receipts: list[str], seconds: int) -> None:
        for start in range(0, len(receipts), _MAX_ENTRIES):
            chunk = receipts[start : start + _MAX_ENTRIES]
            entries = [{"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": seconds}
                       for i, r in enumerate(chunk)]  # fmt: skip
            try:
                await self._call(self._client.change_message_visibility_batch,
                                 QueueUrl=self._url, Entries=entries)  # fmt: skip
            except Exception as exc:  # next round tries again; at worst a redelivery
                log.warning("inbox: SQS visibility change failed: %s", self._why(exc))
                return
            now = time.monotonic()
            for receipt in chunk:
                if receipt in self._held:
                    self._held[receipt] = now
