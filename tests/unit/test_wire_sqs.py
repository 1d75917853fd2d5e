"""The SQS/SNS mapping (outbox.wire.sqs), pure logic: every envelope survives the round trip
within SQS's rules (text body, at most ten non-empty attributes, a valid MessageGroupId), and
whatever a queue hands a consumer decodes to an envelope or a clear InvalidMessageError."""

from __future__ import annotations

import datetime as dt
import string
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import InvalidMessageError
from outbox.envelope import Envelope, is_reserved_header
from outbox.wire import sqs

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_GROUP_CHARS = set(string.ascii_letters + string.digits + string.punctuation)


def _env(**fields: Any) -> Envelope:
    base: dict[str, Any] = {"id": uuid.uuid4(), "topic": "t", "key": "k", "seq": 1,
                            "payload": b'{"n":1}'}  # fmt: skip
    return Envelope(**{**base, **fields})


_envelopes = st.builds(
    _env,
    # publish() takes a key that is non-blank text without NUL
    key=st.text(min_size=1, max_size=200).filter(lambda k: k.strip() != "" and "\x00" not in k),
    seq=st.integers(1, 2**63 - 1),
    payload=st.one_of(st.binary(max_size=300), st.text(max_size=100).map(str.encode)),
    # publish() refuses reserved names as user headers
    headers=st.dictionaries(
        st.text(max_size=10).filter(lambda n: not is_reserved_header(n)),
        st.text(max_size=10),
        max_size=5,
    ),
    traceparent=st.one_of(st.none(), st.just(TRACEPARENT)),
    created_at=st.one_of(st.none(), st.datetimes(timezones=st.just(dt.UTC))),
)


@given(env=_envelopes)
def test_sqs_round_trip_within_the_services_rules(env: Envelope) -> None:
    message = sqs.encode(env)
    assert message.body  # SQS refuses an empty body
    assert not any(c in message.body for c in "\x00\x01\x08\x0b\x1f\ufffe\uffff")
    assert len(message.attributes) <= 10
    for attribute in message.attributes.values():
        assert attribute["DataType"] == "String"
        assert attribute["StringValue"]  # SQS refuses empty values
    assert 1 <= len(message.group_id) <= 128
    assert set(message.group_id) <= _GROUP_CHARS
    assert message.deduplication_id == str(env.id)
    assert sqs.decode(message.body, message.attributes) == env


def test_sqs_text_payload_is_the_body_and_others_travel_base64() -> None:
    text = sqs.encode(_env(payload='{"é": 1}'.encode()))
    assert text.body == '{"é": 1}'
    assert sqs.BODY_ENCODING not in text.attributes
    binary = sqs.encode(_env(payload=b"\x00\xff"))
    assert binary.attributes[sqs.BODY_ENCODING]["StringValue"] == "base64"
    assert binary.body == "AP8="


def test_sqs_group_id_is_the_key_when_allowed_else_its_hash() -> None:
    assert sqs.group_id("order-42/x") == "order-42/x"
    hashed = sqs.group_id("commande été")
    assert hashed.startswith("sha256-")
    assert hashed == sqs.group_id("commande été")  # stable: one key, one group
    assert sqs.group_id("x" * 129).startswith("sha256-")


def test_sqs_encode_refuses_an_empty_content_type() -> None:
    with pytest.raises(InvalidMessageError, match="content-type is empty"):
        sqs.encode(_env(content_type=""))


_attribute = st.one_of(
    st.fixed_dictionaries({"DataType": st.just("String"), "StringValue": st.text(max_size=30)}),
    st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=5), st.integers())),
    st.integers(),
    st.none(),
)
_NAMES = ["outbox-id", "outbox-topic", "outbox-key", "outbox-seq", "outbox-created-at",
          "outbox-headers", "outbox-body", "other"]  # fmt: skip
_names = st.sampled_from(_NAMES)


@given(
    body=st.one_of(st.text(max_size=40), st.none(), st.integers(), st.binary(max_size=10)),
    attributes=st.one_of(
        st.dictionaries(_names, _attribute, max_size=8),
        st.none(),
        st.lists(st.integers()),
        st.text(max_size=5),
    ),
)
def test_sqs_decode_is_total(body: Any, attributes: Any) -> None:
    try:
        envelope = sqs.decode(body, attributes)
    except InvalidMessageError as exc:
        problem = str(exc)
    else:
        assert isinstance(envelope, Envelope)
        return
    assert problem  # named, whatever was wrong


def test_sqs_decode_refuses_hostile_fields_cheaply() -> None:
    good = sqs.encode(_env())
    attributes = dict(good.attributes)
    attributes["outbox-seq"] = {"DataType": "String", "StringValue": "9" * 100_000}
    with pytest.raises(InvalidMessageError, match="not a sequence number"):
        sqs.decode(good.body, attributes)
    attributes = {**good.attributes, "outbox-body": {"DataType": "String", "StringValue": "zip"}}
    with pytest.raises(InvalidMessageError, match="unknown outbox-body") as info:
        sqs.decode(good.body, attributes)
    assert info.value.data["topic"] == "t"  # what is known rides along: it is recorded dead
    with pytest.raises(InvalidMessageError, match="RawMessageDelivery"):
        sqs.decode('{"Type": "Notification", "Message": "..."}', {})
    too_many = {f"a{i}": {"StringValue": "x"} for i in range(100)}
    with pytest.raises(InvalidMessageError, match="at most"):
        sqs.decode("x", too_many)


def test_sqs_user_headers_cannot_forge_envelope_fields() -> None:
    env = _env(headers={"tenant": "acme"})
    message = sqs.encode(env)
    forged = {**message.attributes, "outbox-headers": {
        "DataType": "String", "StringValue": '{"outbox-seq": "99", "tenant": "acme"}'}}  # fmt: skip
    assert sqs.decode(message.body, forged) == env
