"""The relay's claim check: payloads over a topic's threshold go to object storage, and the
broker carries a reference in their place (:mod:`outbox.claimcheck`).

:class:`ClaimCheckPublisher` wraps any :class:`~relay.brokers.base.Publisher`::

    from outbox.claimcheck import ClaimCheck, S3Store
    from relay import ClaimCheckPublisher

    publisher = ClaimCheckPublisher(
        NatsPublisher(...), ClaimCheck(S3Store("my-bucket"), threshold=256 * 1024)
    )

Each payload over its threshold is uploaded (the object's key names the topic and the message
id, so a re-sent message overwrites its own object with the same bytes) before the batch is
handed to the inner publisher; the upload and the publish together must fit the relay's
``publish_timeout``. A failed upload fails its message with a RetryablePublishError (the relay
tries again) and holds back the later messages of its key in the batch (NotSentError), so a
key's order holds as with any failure before sending.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

from outbox.claimcheck import CONTENT_TYPE, OVERRIDE_HEADER, ClaimCheck
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from outbox.kit import redact
from relay.brokers.base import BrokerFeatures, Publisher
from relay.exceptions import NotSentError, RetryablePublishError

__all__ = ["ClaimCheckPublisher"]

log = logging.getLogger("relay.claimcheck")


class ClaimCheckPublisher:
    """``inner``, with the payloads ``claim_check`` wants uploaded first and replaced by a
    reference. ``concurrency``: uploads in flight at once; ``upload_timeout``: seconds one
    upload may take before its message is retried."""

    def __init__(
        self,
        inner: Publisher,
        claim_check: ClaimCheck,
        *,
        concurrency: int = 8,
        upload_timeout: float = 30.0,
    ) -> None:
        if not isinstance(claim_check, ClaimCheck):
            raise ConfigurationError(
                f"claim_check must be an outbox.claimcheck.ClaimCheck, "
                f"not {type(claim_check).__name__}"
            )
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive int, not {concurrency!r}")
        self.inner = inner
        self.claim_check = claim_check
        self.upload_timeout = upload_timeout
        self._slots = asyncio.Semaphore(concurrency)
        #: uploads done, and their bytes (what the bench and the metrics read)
        self.uploaded = 0
        self.uploaded_bytes = 0
        self.features: BrokerFeatures = inner.features

    async def start(self) -> None:
        await self.inner.start()
        self.features = self.inner.features  # an adapter learns its limits on connecting

    async def close(self) -> None:
        await self.inner.close()

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        wanted = self.claim_check.wanted
        todo = [i for i, env in enumerate(envelopes) if wanted(env)]
        outgoing = [_without_override(env) for env in envelopes]
        results: list[BaseException | None] = [None] * len(envelopes)
        if todo:
            uploads = await asyncio.gather(*(self._upload(outgoing[i]) for i in todo))
            for i, done in zip(todo, uploads, strict=True):
                if isinstance(done, Envelope):
                    outgoing[i] = done
                else:
                    results[i] = done
        if not any(results):
            return await self.inner.publish_batch(outgoing)
        # a failed upload holds back the later messages of its key, as any failure before
        # sending does; the rest go to the broker
        blocked: dict[tuple[str, str], Envelope] = {}
        send: list[int] = []
        for i, env in enumerate(outgoing):
            where = (env.topic, env.key)
            if results[i] is not None:
                blocked.setdefault(where, env)
            elif where in blocked:
                results[i] = NotSentError(
                    f"message {env.id}: not sent: message {blocked[where].id} of key "
                    f"{env.key!r} before it in this batch failed its claim check upload",
                    message_id=env.id,
                    reason="not sent",
                )
            else:
                send.append(i)
        if send:
            sent = await self.inner.publish_batch([outgoing[i] for i in send])
            for i, result in zip(send, sent, strict=True):
                results[i] = result
        return results

    async def _upload(self, env: Envelope) -> Envelope | BaseException:
        """``env`` with its payload uploaded and a reference as its body, or why not."""
        key = self.claim_check.object_key(env)
        reference = self.claim_check.reference(env, key)
        store = self.claim_check.store
        try:
            async with self._slots:
                await asyncio.wait_for(
                    asyncio.to_thread(store.put, key, env.payload, env.content_type),
                    self.upload_timeout,
                )
        except Exception as exc:
            why = f"{type(exc).__name__}: {redact(exc)}"
            log.warning("claim check upload of message %s to %r failed: %s", env.id, store, why)
            return RetryablePublishError(
                f"message {env.id}: claim check upload to {store!r} failed: {why}",
                message_id=env.id,
                reason="claim check upload failed",
            )
        self.uploaded += 1
        self.uploaded_bytes += reference.size
        return dataclasses.replace(env, payload=reference.to_bytes(), content_type=CONTENT_TYPE)


def _without_override(env: Envelope) -> Envelope:
    """``env`` without the publisher's override header (it is the relay's, not the reader's)."""
    if OVERRIDE_HEADER not in env.headers:
        return env
    headers = {k: v for k, v in env.headers.items() if k != OVERRIDE_HEADER}
    return dataclasses.replace(env, headers=headers)
