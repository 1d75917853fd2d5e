"""Claim check: a payload too large for the broker travels through object storage.

The payload is written in the caller's transaction as any other (the database stays the
ledger). The relay, when a payload is larger than its topic's threshold, uploads it to an
object store and publishes a *reference* in its place: a small JSON body of content type
:data:`CONTENT_TYPE` naming the store, bucket and object key, the size, the SHA-256 and the
payload's own content type. A consumer resolves the reference before its handler sees the
envelope, checking size and hash (``inbox``'s consumers, ``claim_check=``).

This module is what both sides share: the reference, the per-call override and the stores.
The stores' methods are blocking (boto3, files); the relay and the consumers call them from a
worker thread.

A publisher forces or forbids the claim check of one message with the header
:data:`OVERRIDE_HEADER` (:func:`override` builds it): ``always``, ``never``, or a threshold in
bytes for this message. The relay removes it before publishing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from outbox._optional import require
from outbox._redact import redact, remember_secrets
from outbox.envelope import Envelope, shown
from outbox.exceptions import (
    ConfigurationError,
    InvalidMessageError,
    ObjectMissingError,
    ObjectTooLargeError,
)

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_MAX_DOWNLOAD_BYTES",
    "DEFAULT_THRESHOLD",
    "OVERRIDE_HEADER",
    "ClaimCheck",
    "DirectoryStore",
    "ObjectMissingError",
    "ObjectStore",
    "ObjectTooLargeError",
    "Reference",
    "S3Store",
    "override",
]

#: the content type of a reference body (the envelope's ``content_type`` while it travels)
CONTENT_TYPE = "application/vnd.outbox.claim-check+json"
#: per-message override of the threshold: ``always``, ``never`` or a size in bytes
OVERRIDE_HEADER = "outbox-claim-check"
#: payloads above this many bytes are claim-checked unless the topic says otherwise. 128 KiB
#: fits every broker's default limit, SQS's 256 KiB included once base64 and attributes are
#: counted (docs/how-to/claim-check.md has the table).
DEFAULT_THRESHOLD = 128 * 1024
#: a consumer downloads at most this many bytes for one message unless told otherwise
DEFAULT_MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
#: the longest reference body a consumer reads (a reference is a few hundred bytes)
MAX_REFERENCE_BYTES = 4096

# object keys the stores write and accept: no "..", no absolute path, no control character
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-/]{0,1000}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def override(when: str | int) -> dict[str, str]:
    """The header forcing (``"always"``), forbidding (``"never"``) or setting the threshold
    (bytes) of the claim check for one message: ``publish(..., headers=override("always"))``
    (merge it with your own headers)."""
    if when in ("always", "never"):
        return {OVERRIDE_HEADER: str(when)}
    if isinstance(when, int) and not isinstance(when, bool) and when >= 0:
        return {OVERRIDE_HEADER: str(when)}
    raise ConfigurationError(
        f"claim check override must be 'always', 'never' or a size in bytes, not {when!r}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    """Where a claim-checked payload is, and what it must be."""

    store: str
    bucket: str
    key: str
    size: int
    sha256: str
    content_type: str

    def to_bytes(self) -> bytes:
        return orjson.dumps({"claim_check": 1, **dataclasses.asdict(self)})

    @classmethod
    def from_envelope(cls, envelope: Envelope) -> Reference:
        """The reference an envelope carries; InvalidMessageError (``claim_check_invalid``)
        when its body is not one."""
        known = {"message_id": envelope.id, "topic": envelope.topic, "key": envelope.key,
                 "seq": envelope.seq}  # fmt: skip
        try:
            if len(envelope.payload) > MAX_REFERENCE_BYTES:
                raise ValueError(f"longer than {MAX_REFERENCE_BYTES} bytes")
            body = orjson.loads(envelope.payload)
            if not isinstance(body, dict) or body.get("claim_check") != 1:
                raise ValueError("not a claim check reference of version 1")
            ref = cls(*(body[f.name] for f in dataclasses.fields(cls)))
            if not all(isinstance(getattr(ref, f), str) for f in
                       ("store", "bucket", "key", "sha256", "content_type")):  # fmt: skip
                raise ValueError("a field is not text")
            if isinstance(ref.size, bool) or not isinstance(ref.size, int) or ref.size < 0:
                raise ValueError("size is not a byte count")
            if not _KEY.fullmatch(ref.key) or ".." in ref.key.split("/"):
                raise ValueError(f"object key {shown(ref.key)} is not one a store writes")
            if not _SHA256.fullmatch(ref.sha256):
                raise ValueError("sha256 is not 64 lower-case hex digits")
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidMessageError(
                f"message {envelope.id} has a malformed claim check reference: {exc}",
                reason="claim_check_invalid",
                **known,
            ) from None
        return ref


@runtime_checkable
class ObjectStore(Protocol):
    """Where claim-checked payloads are kept. ``kind`` and ``bucket`` name it in a reference."""

    kind: str
    bucket: str

    def put(self, key: str, data: bytes, content_type: str) -> None:
        """Store ``data`` under ``key`` (overwriting: a re-sent message uploads it again)."""

    def get(self, key: str, max_bytes: int) -> bytes:
        """The object's bytes; ObjectMissingError, or ObjectTooLargeError past ``max_bytes``
        (raised before more than ``max_bytes + 1`` bytes are read)."""


@dataclasses.dataclass(frozen=True)
class ClaimCheck:
    """The relay's claim check: which payloads go to ``store`` and under which keys.

    ``threshold``: payloads larger than this many bytes (``None``: none); ``topics``: a
    threshold per topic (``None`` for a topic: never). A message's :data:`OVERRIDE_HEADER`
    wins over both. Objects are named ``<prefix><topic>/<message id>``.
    """

    store: ObjectStore
    threshold: int | None = DEFAULT_THRESHOLD
    topics: Mapping[str, int | None] = dataclasses.field(default_factory=dict)
    prefix: str = "outbox/"

    def __post_init__(self) -> None:
        if not isinstance(self.store, ObjectStore):
            raise ConfigurationError(
                f"claim check store must be an outbox.claimcheck.ObjectStore, "
                f"not {type(self.store).__name__}"
            )
        for name, value in [("threshold", self.threshold), *self.topics.items()]:
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ConfigurationError(
                    f"claim check threshold for {name!r} must be bytes >= 0 or None, "
                    f"not {value!r}"
                )
        if self.prefix and not _KEY.fullmatch(self.prefix):
            raise ConfigurationError(
                f"claim check prefix {self.prefix!r} may hold only letters, digits, '.', "
                "'_', '-' and '/'"
            )

    def wanted(self, envelope: Envelope) -> bool:
        """Whether ``envelope``'s payload goes to the store."""
        forced = envelope.headers.get(OVERRIDE_HEADER)
        limit = self.topics.get(envelope.topic, self.threshold)
        if forced is not None:
            if forced == "always":
                return True
            if forced == "never":
                return False
            if forced.isascii() and forced.isdigit() and len(forced) < 19:
                limit = int(forced)
        return limit is not None and len(envelope.payload) > limit

    def object_key(self, envelope: Envelope) -> str:
        topic = re.sub(r"[^A-Za-z0-9._\-]", "_", envelope.topic)[:200].lstrip("._-") or "topic"
        return f"{self.prefix}{topic}/{envelope.id}"

    def reference(self, envelope: Envelope, key: str) -> Reference:
        return Reference(
            store=self.store.kind,
            bucket=self.store.bucket,
            key=key,
            size=len(envelope.payload),
            sha256=hashlib.sha256(envelope.payload).hexdigest(),
            content_type=envelope.content_type,
        )


class DirectoryStore:
    """A local directory (tests, single-host deployments): ``<root>/<key>``, written to a
    temporary file and renamed into place, so a reader never sees half an object.

    ``bucket`` names the directory in references (consumers map it to their own path).
    """

    kind = "file"

    def __init__(self, root: str | os.PathLike[str], *, bucket: str = "local") -> None:
        self.root = Path(root).resolve()
        self.bucket = bucket

    def __repr__(self) -> str:
        return f"DirectoryStore({str(self.root)!r}, bucket={self.bucket!r})"

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key) or ".." in key.split("/"):
            raise InvalidMessageError(f"object key {shown(key)} is not one a store writes")
        return self.root / key

    def put(self, key: str, data: bytes, content_type: str) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def get(self, key: str, max_bytes: int) -> bytes:
        path = self._path(key)
        try:
            with path.open("rb") as src:
                size = os.fstat(src.fileno()).st_size
                if size > max_bytes:
                    raise ObjectTooLargeError(
                        f"object {key} is {size} bytes, above max_download_bytes={max_bytes}",
                        reason="claim_check_too_large",
                    )
                data = src.read(max_bytes + 1)
        except FileNotFoundError:
            raise ObjectMissingError(
                f"object {key} is not in {self!r}", reason="claim_check_missing"
            ) from None
        if len(data) > max_bytes:
            raise ObjectTooLargeError(
                f"object {key} is above max_download_bytes={max_bytes}",
                reason="claim_check_too_large",
            )
        return data

    def expire(self, older_than: dt.timedelta) -> int:
        """Delete the objects written more than ``older_than`` ago (run it on the schedule of
        the outbox's retention, with the same age); how many were deleted."""
        cutoff = time.time() - older_than.total_seconds()
        deleted = 0
        for path in self.root.rglob("*"):
            with contextlib.suppress(FileNotFoundError):
                if path.is_file() and path.stat().st_mtime < cutoff:
                    path.unlink()
                    deleted += 1
        return deleted


class S3Store:
    """Amazon S3, or anything speaking its API (MinIO, Ceph, R2; moto in the tests), through
    boto3. Credentials come from AWS's default chain unless given; they are never shown
    (``repr``, errors and logs name the bucket and the endpoint without user-info).

    Retention: give the bucket (or the prefix) a lifecycle rule expiring objects after the
    outbox's retention; :meth:`lifecycle_rule` is that rule and :meth:`apply_lifecycle` puts it.
    """

    kind = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.region = region
        self.endpoint_url = endpoint_url
        self._credentials = {
            "aws_access_key_id": access_key_id,
            "aws_secret_access_key": secret_access_key,
            "aws_session_token": session_token,
        }
        self._client = client
        # masked wherever they appear from now on (a client library's error or log line)
        remember_secrets(endpoint_url, {"secret": secret_access_key, "token": session_token})

    def __repr__(self) -> str:
        where = f", endpoint_url={redact(self.endpoint_url)!r}" if self.endpoint_url else ""
        return f"S3Store({self.bucket!r}{where})"

    @property
    def client(self) -> Any:
        if self._client is None:
            boto3 = require("boto3", "aws")
            config = require("botocore.config", "aws").Config(
                retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=16
            )
            creds = {k: v for k, v in self._credentials.items() if v is not None}
            self._client = boto3.client(
                "s3", region_name=self.region, endpoint_url=self.endpoint_url, config=config,
                **creds,
            )  # fmt: skip
        return self._client

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type)

    def get(self, key: str, max_bytes: int) -> bytes:
        errors = require("botocore.exceptions", "aws")
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=key)
        except errors.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket"):
                raise ObjectMissingError(
                    f"object {key} is not in {self!r} ({code})", reason="claim_check_missing"
                ) from None
            raise
        body = obj["Body"]
        try:
            length = int(obj.get("ContentLength") or 0)
            if length > max_bytes:
                raise ObjectTooLargeError(
                    f"object {key} is {length} bytes, above max_download_bytes={max_bytes}",
                    reason="claim_check_too_large",
                )
            data = bytes(body.read(max_bytes + 1))
        finally:
            body.close()
        if len(data) > max_bytes:
            raise ObjectTooLargeError(
                f"object {key} is above max_download_bytes={max_bytes}",
                reason="claim_check_too_large",
            )
        return data

    def lifecycle_rule(self, days: int, prefix: str = "outbox/") -> dict[str, Any]:
        """The S3 lifecycle rule expiring claim-checked objects ``days`` after upload."""
        return {
            "ID": f"outbox-claim-check-{days}d",
            "Filter": {"Prefix": prefix},
            "Status": "Enabled",
            "Expiration": {"Days": days},
        }

    def apply_lifecycle(self, days: int, prefix: str = "outbox/") -> None:
        """Put :meth:`lifecycle_rule` on the bucket (replacing its lifecycle configuration)."""
        self.client.put_bucket_lifecycle_configuration(
            Bucket=self.bucket,
            LifecycleConfiguration={"Rules": [self.lifecycle_rule(days, prefix)]},
        )
