"""The WAL capture record (outbox/_capture.py): what a writer emits is what the relay decodes,
and a malformed record is refused with what is wrong with it. Pure logic."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox._capture import RecordError, decode_record, encode_record

# what publish() accepts as text: non-blank, without NUL
_text = st.text(min_size=1, max_size=40).filter(lambda t: bool(t.strip()) and "\x00" not in t)


@given(
    topic=_text,
    key=_text,
    traceparent=st.none() | _text,
    payload=st.binary(max_size=200),
    micros=st.none() | st.integers(0, 2**50),
    idempotent=st.booleans(),
)
def test_record_round_trips(
    topic: str,
    key: str,
    traceparent: str | None,
    payload: bytes,
    micros: int | None,
    idempotent: bool,
) -> None:
    at = None
    if micros is not None:
        at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    msg_id = uuid.uuid4()
    data = encode_record(
        id=msg_id, topic=topic, key=key, content_type="application/json",
        traceparent=traceparent, headers='{"h": "v"}', payload=payload, available_at=at,
        idempotent=idempotent,
    )
    record = decode_record(data)
    assert (record.id, record.topic, record.key, record.payload) == (msg_id, topic, key, payload)
    assert record.traceparent == traceparent
    assert record.available_at == at
    assert record.idempotent is idempotent
    assert record.headers == '{"h": "v"}'


def _good() -> bytes:
    return encode_record(
        id=uuid.uuid4(), topic="t", key="k", content_type="application/json",
        traceparent=None, headers="{}", payload=b"{}", available_at=None, idempotent=False,
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01\x00", "shorter than its header"),
        (b"\x02" + _good()[1:], "version 2"),
        (_good()[:-1], "ends inside a field"),
        (_good() + b"x", "after the record's last field"),
    ],
)
def test_malformed_record_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(RecordError, match=reason):
        decode_record(data)
