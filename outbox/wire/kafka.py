"""Kafka: record key = the outbox key (one key, one partition, in order), value = payload,
record headers = the envelope headers as UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES
from outbox.envelope import Envelope
from outbox.wire import cloudevents as ce
from outbox.wire._text import bounded, text, total

__all__ = ["KafkaRecord", "decode", "encode", "fields"]


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """What the relay produces: ``produce(topic, value=value, key=key, headers=headers)``."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def fields(
    envelope: Envelope, cloudevents: ce.CloudEvents | None = None
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of the record: what :func:`encode` holds, without building it
    (the relay's hot path hands them straight to ``produce``). A CloudEvent (Kafka binding:
    ``ce_`` headers, ``content-type``) when ``cloudevents`` covers the topic."""
    value = envelope.payload
    if cloudevents is None or not cloudevents.applies(envelope.topic):
        text_headers = envelope.to_headers()
    elif cloudevents.structured:
        text_headers = cloudevents.structured_headers(envelope)
        value = cloudevents.structured_body(envelope)
    else:
        text_headers = cloudevents.headers(envelope, ce.KAFKA)
    headers = [(name, v.encode()) for name, v in text_headers.items()]
    return envelope.key.encode(), value, headers


def encode(envelope: Envelope, cloudevents: ce.CloudEvents | None = None) -> KafkaRecord:
    key, value, headers = fields(envelope, cloudevents)
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
    if ce.detect(decoded, ce.KAFKA):
        return ce.decode(decoded, value or b"", ce.KAFKA, max_payload_bytes=max_payload_bytes)
    return Envelope.from_headers(decoded, value or b"", max_payload_bytes=max_payload_bytes)
