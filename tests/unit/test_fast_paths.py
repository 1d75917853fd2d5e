"""The producer's and the inbox's fast paths decide exactly as the full checks they skip: the
same value, or the same error (hypothesis, pure logic)."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inbox import _receive
from inbox._receive import as_ref
from inbox._statements import inbox_statements
from outbox import InvalidMessageError, SerializationError
from outbox._message import (
    MAX_TOPIC_BYTES,
    _headers,
    _headers_fully,
    check_text,
    check_text_fully,
)
from outbox._payload import JSON_ENCODER, encode_payload, to_json_value
from outbox._sql import bound_by_position
from outbox.envelope import Envelope

# Text near every edge the checks look at: ASCII controls and blanks, NUL, non-ASCII, lone
# surrogates, lengths around the limit.
_TEXT = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=12),
    st.text(max_size=12),
    st.sampled_from(["", " ", "\t\n", "\x1c", "a\x00b", "\udc80", "é" * 5, "k" * 8, "k" * 9]),
)


def _outcome(check: Any, value: object, limit: int | None) -> tuple[str, str]:
    try:
        return ("ok", check(value, "key", limit))
    except InvalidMessageError as exc:
        return ("error", str(exc))


@given(value=st.one_of(_TEXT, st.integers(), st.none()), limit=st.sampled_from([None, 8, 10]))
def test_check_text_fast_path_decides_as_the_full_checks(value: object, limit: int | None) -> None:
    assert _outcome(check_text, value, limit) == _outcome(check_text_fully, value, limit)


_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
    st.sampled_from([math.nan, math.inf, 1.5]),
)  # fmt: skip
_JSONISH = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
        st.dictionaries(st.one_of(st.integers(), st.booleans(), st.none()), inner, max_size=2),
    ),
    max_leaves=8,
)


def _full(payload: Any) -> tuple[str, Any]:
    try:
        text = JSON_ENCODER.encode(to_json_value(payload, "payload")).encode("utf-8")
        return ("ok", json.loads(text))
    except (SerializationError, UnicodeEncodeError) as exc:
        return ("error", type(exc).__name__)


@given(payload=st.one_of(_JSONISH, st.integers(min_value=2**63, max_value=2**70)))
def test_payload_fast_path_encodes_as_the_full_walk(payload: Any) -> None:
    # The same JSON value (a float may be spelt differently: "1e16" or "1e+16"), or
    # the same error. Ints beyond 64 bits are declined by orjson and take the full walk.
    try:
        fast: tuple[str, Any] = ("ok", json.loads(encode_payload(payload, None)[0]))
    except SerializationError as exc:
        # encode_payload reports a lone surrogate as a SerializationError too
        fast = ("error", "UnicodeEncodeError" if "surrogate" in str(exc) else type(exc).__name__)
    assert fast == _full(payload)


_NAME = st.one_of(
    st.sampled_from(["type", "x-tenant-id", "Type", "outbox-id", "traceparent", "", "a b", "a:b"]),
    st.text(max_size=6),
)
_VALUE = st.one_of(
    st.sampled_from(["OrderCreated", "", " ", "a\tb", "a\nb", "a\rb", "a\x00b", "\x7f", "é"]),
    st.just("\udc80"),
    st.text(max_size=6),
    st.integers(),
)


def _header_outcome(encode: Any, headers: Any) -> tuple[str, Any]:
    try:
        return ("ok", encode(headers))
    except SerializationError as exc:
        return ("error", str(exc))


@given(headers=st.dictionaries(_NAME, _VALUE, max_size=3))
def test_headers_fast_path_decides_as_the_full_checks(headers: dict[str, Any]) -> None:
    # Twice: the first call may add the names to the cache of checked names, the second then
    # takes the fast path with them; both must decide as the full checks.
    expected = _header_outcome(_headers_fully, headers)
    for _ in range(2):
        outcome = _header_outcome(_headers, headers)
        assert outcome[0] == expected[0]
        if outcome[0] == "ok":
            assert json.loads(outcome[1]) == json.loads(expected[1])
        else:
            assert outcome[1] == expected[1]


_NAME = st.one_of(_TEXT, st.integers(), st.none(), st.lists(st.integers(), max_size=1))


def _ref_outcome(consumer: object, topic: object) -> tuple[str, str]:
    message = Envelope(uuid.uuid4(), topic, "k", 1, b"{}")  # type: ignore[arg-type]
    try:
        ref = as_ref(consumer, message)  # type: ignore[arg-type]
        return ("ok", f"{ref.consumer}|{ref.topic}")
    except InvalidMessageError as exc:
        return ("error", str(exc))


def _ref_fully(consumer: object, topic: object) -> tuple[str, str]:
    try:
        check_text_fully(consumer, "consumer", MAX_TOPIC_BYTES)
        check_text_fully(topic, "message topic", MAX_TOPIC_BYTES)
        return ("ok", f"{consumer}|{topic}")
    except InvalidMessageError as exc:
        return ("error", str(exc))


@given(consumer=_NAME, topic=_NAME)
def test_checked_names_decide_as_the_full_checks(consumer: object, topic: object) -> None:
    # twice: the second call takes the checked-names path for the names the first one passed
    assert _ref_outcome(consumer, topic) == _ref_fully(consumer, topic)
    assert _ref_outcome(consumer, topic) == _ref_fully(consumer, topic)
    # a name that passed as a topic is also taken as a consumer, and the other way round
    assert _ref_outcome(topic, consumer)[0] == _ref_fully(topic, consumer)[0]


def test_checked_names_are_bounded() -> None:
    for n in range(_receive._MAX_CHECKED_NAMES + 50):
        as_ref(f"consumer-{n}", Envelope(uuid.uuid4(), "t", "k", 1, b"{}"))
    assert len(_receive._CHECKED_NAMES) <= _receive._MAX_CHECKED_NAMES
    with pytest.raises(InvalidMessageError, match="consumer must not be empty"):
        as_ref(" ", Envelope(uuid.uuid4(), "t", "k", 1, b"{}"))


def test_bound_by_position_keeps_one_order_or_refuses() -> None:
    text = "INSERT INTO t VALUES (%(a)s, %(b)s) -- 100%%"
    assert bound_by_position(text, ("a", "b")) == "INSERT INTO t VALUES (%s, %s) -- 100%%"
    with pytest.raises(TypeError, match="not \\['b', 'a'\\]"):
        bound_by_position(text, ("b", "a"))
    with pytest.raises(TypeError, match="each once"):
        bound_by_position("SELECT %(a)s, %(a)s", ("a",))


def test_the_record_statement_binds_the_same_columns_both_ways() -> None:
    stmts = inbox_statements(None)
    assert stmts.record_args.count(b"%s") == 5
    named = re.sub(rb"%\(\w+\)s", b"%s", stmts.record)
    assert named == stmts.record_args
