"""Kafka: record key = the outbox key (one key, one partition, in order), value = payload,
record headers = the envelope headers as UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES
from outbox.envelope import Envelope
from outbox.wire._text import bounded, text, total

__all__ = ["KafkaRecord", "decode", "encode", "fields"]


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """What the relay produces: ``produce(topic, value=value, key=key, headers=headers)``."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def fields(envelope: Envelope) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of the record: what :func:`encode` holds, without building it
    (the relay's hot path hands them straight to ``produce``)."""
    headers = [(name, value.encode()) for name, value in envelope.to_headers().items()]
    return envelope.key.encode(), envelope.payload, headers


def encode(envelope: Envelope) -> KafkaRecord:
    key, value, headers = fields(envelope)
    return KafkaRecord(key=key, value=value, headers=headers)


@total
def decode(
    headers: Iterable[tuple[str, bytes | None]] | None,
    value: bytes | None,
    *,
    max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
) -> Envelope:
    """The envelope of a consumed record (``msg.headers()``, ``msg.value()``); raises
    :class:`~outbox.exceptions.InvalidMessageError` for anything else.

    A header with a null value is not one of ours and is ignored; a null value is an empty body.
    """
    decoded = {text(name): text(v) for name, v in bounded(headers or []) if v is not None}
    return Envelope.from_headers(decoded, value or b"", max_payload_bytes=max_payload_bytes)
