"""Envelope.from_headers yields an Envelope or an InvalidMessageError naming the header at fault
and carrying what was read (hypothesis, pure logic). Every wire module's decoder, with hostile
sizes and shapes: tests/unit/test_wire_decoders_total.py."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import InvalidMessageError
from outbox.envelope import (
    HEADER_CREATED_AT,
    HEADER_ID,
    HEADER_KEY,
    HEADER_SEQ,
    HEADER_TOPIC,
    Envelope,
)

_text = st.text(max_size=40)
_values = {
    HEADER_ID: st.one_of(st.uuids().map(str), _text),
    HEADER_TOPIC: _text,
    HEADER_KEY: _text,
    HEADER_SEQ: st.one_of(st.integers(-5, 2**70).map(str), _text),
    HEADER_CREATED_AT: st.one_of(st.datetimes().map(lambda d: d.isoformat()), _text),
}
# some envelope headers present (any value, any case), others missing, plus arbitrary ones
_headers = st.builds(
    lambda chosen, upper, extra: {
        **extra,
        **{(name.upper() if upper else name): value for name, value in chosen.items()},
    },
    st.fixed_dictionaries({}, optional=_values),
    st.booleans(),
    st.dictionaries(_text, _text, max_size=4),
)


@given(headers=_headers, payload=st.binary(max_size=64))
def test_from_headers_returns_an_envelope_or_names_the_problem(
    headers: dict[str, str], payload: bytes
) -> None:
    try:
        envelope = Envelope.from_headers(headers, payload)
    except InvalidMessageError as exc:
        problem = str(exc)
    else:
        assert isinstance(envelope.id, uuid.UUID)
        assert envelope.seq >= 0
        assert envelope.payload == payload
        return
    assert "outbox header" in problem  # named, whatever was wrong


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (HEADER_SEQ, "abc", "not a positive integer"),
        (HEADER_SEQ, "-3", "not a positive integer"),
        (HEADER_SEQ, "1_000", "not a positive integer"),
        (HEADER_ID, "order-1", "not a UUID"),
        (HEADER_CREATED_AT, "yesterday", "not an ISO 8601 time"),
    ],
)
def test_malformed_header_is_named_and_carries_what_was_read(
    field: str, value: str, message: str
) -> None:
    good = Envelope(id=uuid.uuid4(), topic="orders", key="k", seq=3, payload=b"{}")
    headers = {**good.to_headers(), HEADER_CREATED_AT: "2026-11-24T10:00:00+00:00", field: value}
    with pytest.raises(InvalidMessageError, match=message) as info:
        Envelope.from_headers(headers, b"{}")
    assert (info.value.data["topic"], info.value.data["key"]) == ("orders", "k")
    if field != HEADER_ID:
        assert info.value.data["message_id"] == good.id
