"""A consumer's side of the claim check: a reference (:mod:`outbox.claimcheck`) is resolved
to its payload before the handler sees the envelope.

The object is fetched from the store the reference names (matched by kind and bucket among
the consumer's stores), at most ``max_download_bytes`` of it, and checked: its size and its
SHA-256 must be the reference's. A message whose object is missing, altered, too large, or in
a store the consumer does not know is refused with its own reason (``claim_check_missing``,
``claim_check_mismatch``, ``claim_check_too_large``, ``claim_check_unresolvable``,
``claim_check_invalid``), counted in ``inbox_refused{reason}`` and recorded dead: it is never
applied. A store that cannot be reached (a network error) is not the message's fault: the
message is left to the broker to deliver again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Sequence

from inbox.exceptions import ClaimCheckStoreError
from outbox.claimcheck import (
    CONTENT_TYPE,
    DEFAULT_MAX_DOWNLOAD_BYTES,
    ObjectStore,
    Reference,
)
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError, InvalidMessageError
from outbox.kit import redact

__all__ = ["ClaimCheckResolver"]


class ClaimCheckResolver:
    """Resolves references against ``stores``; pass it to a consumer as ``claim_check=``."""

    def __init__(
        self,
        stores: ObjectStore | Sequence[ObjectStore],
        *,
        max_download_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES,
        concurrency: int = 4,
    ) -> None:
        listed = [stores] if isinstance(stores, ObjectStore) else list(stores)
        if not listed or not all(isinstance(s, ObjectStore) for s in listed):
            raise ConfigurationError(
                "claim_check stores must be one or more outbox.claimcheck.ObjectStore"
            )
        if isinstance(max_download_bytes, bool) or not (
            isinstance(max_download_bytes, int) and max_download_bytes > 0
        ):
            raise ConfigurationError(
                f"max_download_bytes must be a positive int, not {max_download_bytes!r}"
            )
        self.stores = {(s.kind, s.bucket): s for s in listed}
        self.max_download_bytes = max_download_bytes
        self._slots = asyncio.Semaphore(concurrency)

    @staticmethod
    def is_reference(envelope: Envelope) -> bool:
        return envelope.content_type == CONTENT_TYPE

    async def resolve(self, envelope: Envelope) -> Envelope:
        """``envelope`` with its payload and content type fetched and checked (unchanged when
        it is not a reference); InvalidMessageError with a claim check reason otherwise."""
        if envelope.content_type != CONTENT_TYPE:
            return envelope
        ref = Reference.from_envelope(envelope)
        known = {"message_id": envelope.id, "topic": envelope.topic, "key": envelope.key,
                 "seq": envelope.seq}  # fmt: skip
        store = self.stores.get((ref.store, ref.bucket))
        if store is None:
            raise InvalidMessageError(
                f"message {envelope.id} is claim-checked in {ref.store} bucket {ref.bucket!r}, "
                "a store this consumer was not given",
                reason="claim_check_unresolvable",
                **known,
            )
        if ref.size > self.max_download_bytes:
            raise InvalidMessageError(
                f"message {envelope.id}'s claim-checked payload is {ref.size} bytes, above "
                f"max_download_bytes={self.max_download_bytes}",
                reason="claim_check_too_large",
                **known,
            )
        # a byte more than the reference says, so a longer object is seen as such
        limit = min(ref.size + 1, self.max_download_bytes)
        try:
            async with self._slots:
                data = await asyncio.to_thread(store.get, ref.key, limit)
        except InvalidMessageError as exc:  # missing; or longer than the reference says
            reason = exc.data.get("reason", "claim_check_missing")
            raise InvalidMessageError(
                f"message {envelope.id}: {exc.message}",
                reason="claim_check_mismatch" if reason == "claim_check_too_large" else reason,
                **known,
            ) from None
        except Exception as exc:
            raise ClaimCheckStoreError(
                f"claim check store {store!r} failed for message {envelope.id}: "
                f"{type(exc).__name__}: {redact(exc)}"
            ) from None  # the client's exception may name the endpoint's user-info
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise InvalidMessageError(
                f"message {envelope.id}'s claim-checked object {ref.key} is not what was "
                f"published (size {len(data)}, reference {ref.size}; or its SHA-256 differs)",
                reason="claim_check_mismatch",
                **known,
            )
        return dataclasses.replace(envelope, payload=data, content_type=ref.content_type)
