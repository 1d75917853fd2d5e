"""Each broker's wire mapping (``outbox.wire``) round-trips every envelope (hypothesis, pure
logic): what ``encode`` produces, carried as the broker's client hands it to a consumer, is
decoded back to an equal envelope. The live round trip through each broker is in
``tests/contract/test_wire_contract.py``."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import InvalidMessageError
from outbox.envelope import Envelope, is_reserved_header
from outbox.wire import jsonl, kafka, mqtt, nats, rabbitmq, redis

_header_names = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"),
    min_size=1,
    max_size=12,
).filter(lambda name: not is_reserved_header(name))

# what publish() accepts as a topic or key: non-blank text without NUL
_names = st.text(min_size=1, max_size=20).filter(lambda t: bool(t.strip()) and "\x00" not in t)

envelopes = st.builds(
    Envelope,
    id=st.uuids(),
    topic=_names,
    key=_names,
    seq=st.integers(1, 2**62),
    payload=st.binary(max_size=64),
    content_type=st.sampled_from(["application/json", "application/octet-stream", "text/plain"]),
    headers=st.dictionaries(_header_names, st.text(max_size=20), max_size=4),
    traceparent=st.none() | st.just("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    created_at=st.none() | st.datetimes(timezones=st.just(dt.UTC)),
)


@given(env=envelopes)
def test_nats_round_trip(env: Envelope) -> None:
    msg = nats.encode(env)
    assert msg.headers[nats.MSG_ID_HEADER] == str(env.id)  # JetStream's dedup is the outbox id
    assert nats.decode(msg.headers, msg.data) == env


@given(env=envelopes)
def test_rabbitmq_round_trip_with_byte_header_values(env: Envelope) -> None:
    msg = rabbitmq.encode(env)
    assert (msg.message_id, msg.content_type) == (str(env.id), env.content_type)
    as_received = {k: v.encode() for k, v in msg.headers.items()}  # AMQP long strings
    assert rabbitmq.decode(as_received, msg.body) == env
    assert rabbitmq.decode(msg.headers, msg.body) == env


@given(env=envelopes)
def test_kafka_round_trip(env: Envelope) -> None:
    record = kafka.encode(env)
    assert record.key == env.key.encode()  # one key, one partition
    assert kafka.decode(record.headers, record.value) == env


@given(env=envelopes)
def test_redis_round_trip_as_bytes(env: Envelope) -> None:
    fields = redis.encode(env)
    as_received = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}
    assert redis.decode(as_received) == env


@given(env=envelopes)
def test_mqtt_round_trip(env: Envelope) -> None:
    msg = mqtt.encode(env)
    assert msg.content_type == env.content_type
    assert mqtt.decode(msg.user_properties, msg.payload) == env


@given(env=envelopes, destination=st.text(min_size=1, max_size=20))
def test_jsonl_round_trip(env: Envelope, destination: str) -> None:
    line = jsonl.encode(env, destination)
    assert line.endswith("\n")
    assert line.count("\n") == 1
    assert jsonl.decode(line) == (destination, env)


def test_redis_refuses_a_user_header_named_payload() -> None:
    env = Envelope(id=uuid.uuid4(), topic="t", key="k", seq=1, payload=b"{}",
                   headers={"payload": "x"})  # fmt: skip
    with pytest.raises(InvalidMessageError, match="rename the header"):
        redis.encode(env)
