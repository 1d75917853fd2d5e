"""Pure logic of the producer side: ids, payload encoding, validation, the envelope."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from outbox import InvalidMessageError, Message, SerializationError, id_from_idempotency_key
from outbox._message import prepare
from outbox._payload import encode_payload
from outbox.envelope import Envelope, is_reserved_header


def test_new_ids_are_uuid7_and_time_ordered() -> None:
    ids = [prepare(Message("t", "k", {})).id for _ in range(200)]
    assert all(isinstance(i, uuid.UUID) and i.version == 7 for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_idempotency_ids_are_stable_and_scoped_by_topic() -> None:
    a = id_from_idempotency_key("orders", "order-1-created")
    assert a == id_from_idempotency_key("orders", "order-1-created")
    assert a != id_from_idempotency_key("payments", "order-1-created")
    assert a != id_from_idempotency_key("orders", "order-2-created")
    assert prepare(Message("orders", "1", {}, idempotency_key="order-1-created")).id == a


@pytest.mark.parametrize(
    ("payload", "body", "content_type"),
    [
        (
            {"b": [1, 2.5, None, True], "a": "é"},
            '{"b":[1,2.5,null,true],"a":"é"}',
            "application/json",
        ),
        ("text", '"text"', "application/json"),
        (b"\x00raw", "\x00raw", "application/octet-stream"),
        (
            {"id": uuid.UUID(int=1)},
            '{"id":"00000000-0000-0000-0000-000000000001"}',
            "application/json",
        ),
        (
            {"at": dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC)},
            '{"at":"2026-01-02T03:04:00+00:00"}',
            "application/json",
        ),
    ],
)
def test_encode_payload(payload: object, body: str, content_type: str) -> None:
    assert encode_payload(payload, None) == (body.encode(), content_type)


def test_encode_error_names_path_and_type() -> None:
    class Money:
        pass

    with pytest.raises(SerializationError) as info:
        encode_payload({"lines": [{"ok": 1}, {"price": Money()}]}, None)
    assert info.value.where == "payload['lines'][1]['price']"
    assert "Money" in str(info.value)
    assert "convert it before publishing" in str(info.value)


def test_explicit_content_type_is_kept() -> None:
    assert encode_payload(b"<x/>", "application/xml") == (b"<x/>", "application/xml")


def test_deliver_after_becomes_absolute_time() -> None:
    before = dt.datetime.now(dt.UTC)
    prepared = prepare(Message("t", "k", {}, deliver_after=dt.timedelta(minutes=5)))
    assert prepared.available_at is not None
    assert before + dt.timedelta(minutes=5) <= prepared.available_at


@pytest.mark.parametrize("field", ["topic", "key"])
def test_nul_characters_are_refused(field: str) -> None:
    kwargs = {"topic": "t", "key": "k", "payload": {}} | {field: "a\x00b"}
    with pytest.raises(InvalidMessageError, match=f"{field} must not contain NUL"):
        prepare(Message(**kwargs))


def test_envelope_round_trips_through_headers() -> None:
    env = Envelope(
        id=uuid.uuid4(),
        topic="orders",
        key="o-1",
        seq=7,
        payload=b"{}",
        headers={"type": "OrderCreated"},
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )
    headers = env.to_headers()
    assert headers["outbox-seq"] == "7"
    assert Envelope.from_headers(headers, b"{}") == env


def test_envelope_from_foreign_message_names_missing_headers() -> None:
    with pytest.raises(InvalidMessageError, match="outbox-id, outbox-seq"):
        Envelope.from_headers({"outbox-topic": "t", "outbox-key": "k"}, b"")


def test_reserved_header_names() -> None:
    assert is_reserved_header("Outbox-Anything")
    assert is_reserved_header("traceparent")
    assert not is_reserved_header("type")


def test_broker_fields_are_reserved_and_not_user_headers() -> None:
    assert is_reserved_header("payload")
    assert is_reserved_header("Nats-Msg-Id")
    env = Envelope(id=uuid.uuid4(), topic="t", key="k", seq=1, payload=b"")
    headers = env.to_headers() | {"Nats-Msg-Id": str(env.id), "type": "A"}
    assert Envelope.from_headers(headers, b"").headers == {"type": "A"}


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({f"h{i}": "v" for i in range(65)}, "65 headers, above the maximum of 64"),
        ({"n" * 256: "v"}, "a name of 256 bytes"),
        ({"big": "v" * 16_385}, "a value of 16385 bytes"),
        ({"big": "é" * 8_193}, "a value of 16386 bytes"),  # counted in UTF-8 bytes
    ],
)
def test_headers_beyond_what_consumers_accept_are_refused(
    headers: dict[str, str], problem: str
) -> None:
    with pytest.raises(SerializationError, match=problem):
        prepare(Message("t", "k", {}, headers=headers))


def test_headers_at_the_limits_round_trip_through_every_decoder() -> None:
    """What publish() accepts, no decoder refuses: the limits have one home."""
    from outbox.wire import kafka, mqtt, nats, rabbitmq, redis

    headers = {f"h{i:02}": "v" for i in range(63)} | {"n" * 255: "é" * 8_192}
    prepared = prepare(Message("t" * 255, "k" * 1024, {}, headers=headers))
    env = Envelope(id=prepared.id, topic=prepared.topic, key=prepared.key, seq=2**63 - 1,
                   payload=prepared.payload, headers=headers)  # fmt: skip
    decoded = [
        nats.decode(nats.encode(env).headers, env.payload),
        rabbitmq.decode(rabbitmq.encode(env).headers, env.payload),
        kafka.decode(kafka.encode(env).headers, env.payload),
        redis.decode(redis.encode(env)),
        mqtt.decode(mqtt.encode(env).user_properties, env.payload),
    ]
    assert all(d == env for d in decoded)
