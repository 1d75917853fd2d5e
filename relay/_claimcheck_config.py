"""The claim check in the relay's config: the ``[claim_check]`` table, ``OUTBOX_CLAIM_CHECK_*``.

The table names a store (``s3`` or ``directory``) and the thresholds of
:class:`outbox.claimcheck.ClaimCheck`; the daemon wraps its publisher in
:class:`relay.ClaimCheckPublisher` when it is there. S3 credentials are never settings: boto3
finds them in AWS's default chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, an instance or task role), so a key written into the file is refused.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from outbox.claimcheck import DEFAULT_THRESHOLD, ClaimCheck, DirectoryStore, S3Store
from outbox.exceptions import ConfigurationError
from outbox.kit import check_keys, check_value, parse_env, redact

__all__ = [
    "CLAIM_CHECK_HELP",
    "build_claim_check",
    "check_store",
    "claim_check_from_env",
    "validate_claim_check",
]

#: what each ``[claim_check]`` key means (the settings reference prints these)
CLAIM_CHECK_HELP: dict[str, str] = {
    "store": 'required: "s3" (S3 or anything speaking its API) or "directory" (local)',
    "bucket": 'the S3 bucket (store = "s3"; required there)',
    "endpoint_url": "a local or private S3 endpoint instead of AWS's (MinIO, Ceph, R2)",
    "region": "the bucket's AWS region (default: AWS_REGION / AWS_DEFAULT_REGION)",
    "directory": 'the directory objects are written to (store = "directory"; required there)',
    "prefix": "what every object's key starts with (then the topic, a slash and the message id)",
    "threshold": f"payloads larger than this many bytes go to the store (default "
    f"{DEFAULT_THRESHOLD})",
    "topics": "a threshold per topic (a table: topic = bytes), over threshold",
}
_STORES = ("s3", "directory")
_INTS = ("threshold",)
#: credentials come from the environment, never from the file (nor OUTBOX_CLAIM_CHECK_*)
_SECRETS = {
    "aws_secret_access_key", "secret_access_key", "aws_access_key_id", "access_key_id",
    "aws_session_token", "session_token", "password",
}  # fmt: skip
_ENV = "OUTBOX_CLAIM_CHECK_"


def validate_claim_check(table: object, where: str = "[claim_check]") -> None:
    """Refuse a ``[claim_check]`` table that would not build its ClaimCheck; one line naming
    ``where`` (a file's table, or the variables)."""
    build_claim_check(table, where)


def build_claim_check(table: object, where: str = "[claim_check]") -> ClaimCheck:
    """The :class:`ClaimCheck` of a ``[claim_check]`` table (no connection is made)."""
    if not isinstance(table, Mapping):
        raise ConfigurationError(f"{where}: claim_check must be a table, got {table!r}")
    secret = next((k for k in table if str(k).lower() in _SECRETS), None)
    if secret is not None:
        raise ConfigurationError(
            f"{where}: {secret} does not belong in the configuration: S3 credentials come "
            "from the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an "
            "instance role)",
            setting="claim_check",
        )
    check_keys(table, sorted(CLAIM_CHECK_HELP), where)
    store = table.get("store")
    check_value("store", store, store in _STORES, 'one of "s3", "directory"', where=where)
    for name in ("bucket", "endpoint_url", "region", "directory", "prefix"):
        value = table.get(name)
        check_value(name, value, value is None or (isinstance(value, str) and value != ""),
                    "a non-empty string", where=where)  # fmt: skip
    needed = "bucket" if store == "s3" else "directory"
    other = ("directory",) if store == "s3" else ("bucket", "endpoint_url", "region")
    if not table.get(needed):
        raise ConfigurationError(f'{where}: store = "{store}" needs {needed}')
    stray = next((k for k in other if k in table), None)
    if stray is not None:
        raise ConfigurationError(f'{where}: {stray} is not a setting of store = "{store}"')
    topics = table.get("topics", {})
    check_value("topics", topics, isinstance(topics, Mapping), "a table of topic = bytes",
                where=where)  # fmt: skip
    for name, value in [("threshold", table.get("threshold", DEFAULT_THRESHOLD)),
                        *((f"topics.{t}", v) for t, v in topics.items())]:  # fmt: skip
        check_value(name, value, _is_bytes(value), "a number of bytes >= 0", where=where)
    made: DirectoryStore | S3Store = (
        S3Store(str(table["bucket"]), region=table.get("region"),
                endpoint_url=table.get("endpoint_url"))
        if store == "s3"
        else DirectoryStore(str(table["directory"]))
    )  # fmt: skip
    try:
        return ClaimCheck(
            made,
            threshold=table.get("threshold", DEFAULT_THRESHOLD),
            topics=dict(topics),
            prefix=table.get("prefix", "outbox/"),
        )
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc.message}", setting="claim_check") from exc


def _is_bytes(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def claim_check_from_env(
    env: Mapping[str, str], values: dict[str, Any], origin: dict[str, str]
) -> None:
    """``OUTBOX_CLAIM_CHECK_<OPTION>`` over the file's ``[claim_check]`` (``..._TOPICS`` is
    ``topic=bytes,...``)."""
    raw = {k: v for k, v in env.items() if k.startswith(_ENV) and v != ""}
    if not raw:
        return
    table = dict(values.get("claim_check") or {})
    for var, text in sorted(raw.items()):
        name = var.removeprefix(_ENV).lower()
        if name in _SECRETS:
            raise ConfigurationError(
                f"{var}: S3 credentials are not relay settings: set AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) instead",
                setting="claim_check",
            )
        check_keys([name], sorted(CLAIM_CHECK_HELP), var, what="claim check option")
        if name in _INTS:
            table[name] = parse_env(var, text, int, "claim_check")
        elif name == "topics":
            pairs = [p.partition("=") for p in text.split(",") if p.strip()]
            if not all(sep and v.strip().isdigit() for _, sep, v in pairs):
                raise ConfigurationError(f"{var} must be topic=bytes[,topic=bytes...]")
            table[name] = {**table.get(name, {}), **{t.strip(): int(v) for t, _, v in pairs}}
        else:
            table[name] = text
        origin[f"claim_check.{name}"] = var
    values["claim_check"] = table


async def check_store(claim_check: ClaimCheck, bound: float) -> tuple[bool, str]:
    """Whether the claim check's store can take objects: the bucket exists (HEAD), or the
    directory is writable (a file written and removed there). Writes nothing else."""
    store = claim_check.store
    where = f"claim check store {store!r}"
    try:
        found = await asyncio.wait_for(asyncio.to_thread(_probe, store), bound)
    except TimeoutError:
        return False, f"{where}: FAILED: no answer within {bound:g}s"
    except Exception as exc:
        return False, f"{where}: FAILED: {type(exc).__name__}: {redact(exc)}"
    return True, f"{where}: ok, {found}"


def _probe(store: object) -> str:
    if isinstance(store, S3Store):
        store.client.head_bucket(Bucket=store.bucket)
        return f"bucket {store.bucket} exists"
    if isinstance(store, DirectoryStore):
        root = Path(store.root)
        if not root.exists():
            parent = next(p for p in root.parents if p.exists())
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PermissionError(f"{root} does not exist and {parent} is not writable")
            return f"{root} does not exist yet: the relay creates it"
        with tempfile.NamedTemporaryFile(dir=root, prefix=".outbox-check-"):
            pass
        return f"{root} is writable"
    return "not checked (not an S3 or directory store)"
