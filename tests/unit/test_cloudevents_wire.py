"""CloudEvents on every broker's wire mapping (pure logic, no broker): what the relay encodes
decodes back to the same envelope, in binary and structured mode, beside our own format; the
official CloudEvents SDK (``cloudevents`` on PyPI, an independent implementation) reads what
we write where it has the binding, and what it writes is decoded by our consumers' decoders.
The live tests (tests/relay/test_cloudevents_live.py) do the same through the brokers."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pytest

from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.wire import amqp1, kafka, mqtt, nats, rabbitmq, redis, sqs
from outbox.wire.cloudevents import FOREIGN_NAMESPACE, CloudEvents

CE = CloudEvents(source="//orders.example.com")
CREATED = dt.datetime(2026, 11, 28, 9, 30, 1, 123456, tzinfo=dt.UTC)


def _envelope(payload: bytes = b'{"total":42}', content_type: str = "application/json",
              topic: str = "orders") -> Envelope:  # fmt: skip
    return Envelope(
        id=uuid.uuid4(), topic=topic, key="order 7 %", seq=42, payload=payload,
        content_type=content_type, headers={"tenant": "acme"},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        created_at=CREATED,
    )  # fmt: skip


def _round_trip(broker: str, env: Envelope, ce: CloudEvents) -> Envelope:
    if broker == "nats":
        m = nats.encode(env, ce)
        return nats.decode(m.headers, m.data)
    if broker == "kafka":
        k = kafka.encode(env, ce)
        return kafka.decode(k.headers, k.value)
    if broker == "rabbitmq":
        r = rabbitmq.encode(env, ce)
        return rabbitmq.decode(r.headers, r.body, content_type=r.content_type)
    if broker == "mqtt":
        q = mqtt.encode(env, ce)
        return mqtt.decode(q.user_properties, q.payload)
    if broker == "redis":
        fields = redis.encode(env, ce)
        return redis.decode({k.encode(): v if isinstance(v, bytes) else v.encode()
                             for k, v in fields.items()})  # fmt: skip
    if broker == "amqp1":
        a = amqp1.encode(env, ce)
        return amqp1.decode(a.properties, a.body)
    s = sqs.encode(env, ce)
    return sqs.decode(s.body, s.attributes)


BROKERS = ["nats", "kafka", "rabbitmq", "mqtt", "redis", "amqp1", "sqs"]


@pytest.mark.parametrize("structured", [False, True], ids=["binary", "structured"])
@pytest.mark.parametrize("broker", BROKERS)
@pytest.mark.parametrize("payload", [b'{"total":42}', b"\x00\xffbinary"], ids=["json", "bytes"])
def test_a_cloudevent_decodes_back_to_the_envelope(
    broker: str, structured: bool, payload: bytes
) -> None:
    ctype = "application/json" if payload.startswith(b"{") else "application/octet-stream"
    env = _envelope(payload, ctype)
    ce = CloudEvents(source=CE.source, structured=structured)
    assert _round_trip(broker, env, ce) == env


@pytest.mark.parametrize("structured", [False, True], ids=["binary", "structured"])
@pytest.mark.parametrize("broker", BROKERS)
def test_the_origin_travels_as_an_extension(broker: str, structured: bool) -> None:
    """The database a message came from (``Envelope.origin``) survives the CloudEvents format:
    an ordered consumer keeps one position per origin, topic and key."""
    env = dataclasses.replace(_envelope(), origin="tenant-a 7f3c")
    ce = CloudEvents(source=CE.source, structured=structured)
    assert _round_trip(broker, env, ce) == env
    assert ce.attributes(env)["outboxorigin"] == "tenant-a 7f3c"


@pytest.mark.parametrize("broker", BROKERS)
def test_a_mapped_type_keeps_the_topic_and_other_topics_stay_in_our_format(broker: str) -> None:
    ce = CloudEvents(source="urn:svc", types={"orders": "com.example.order.placed"},
                     topics=frozenset({"orders"}))  # fmt: skip
    env = _envelope()
    assert _round_trip(broker, env, ce) == env
    other = _envelope(topic="audit")
    assert _round_trip(broker, other, ce) == other
    if broker == "kafka":  # the one not covered travels with our own headers
        names = [n for n, _ in kafka.encode(other, ce).headers]
        assert "outbox-id" in names
        assert not any(n.startswith("ce_") for n in names)


def test_the_binary_attributes_are_the_bindings_own() -> None:
    env = _envelope()
    headers = dict(kafka.encode(env, CE).headers)
    assert headers["ce_specversion"] == b"1.0"
    assert headers["ce_id"] == str(env.id).encode()
    assert headers["ce_source"] == b"//orders.example.com"
    assert headers["ce_type"] == b"orders"
    assert headers["ce_subject"] == b"order 7 %"
    assert headers["ce_time"] == b"2026-11-28T09:30:01.123456Z"
    assert headers["ce_sequence"] == b"0000000000000000042"  # lexicographic order
    assert headers["ce_traceparent"] == env.traceparent.encode()  # type: ignore[union-attr]
    assert headers["content-type"] == b"application/json"
    assert headers["tenant"] == b"acme"
    assert not any(n.startswith("outbox-") for n in headers)
    nats_headers = nats.encode(env, CE).headers
    assert nats_headers["ce-subject"] == "order%207%20%25"  # percent-encoded as HTTP's
    assert nats_headers["Nats-Msg-Id"] == str(env.id)
    assert dict(mqtt.encode(env, CE).user_properties)["subject"] == "order 7 %"
    assert amqp1.encode(env, CE).properties["cloudEvents_id"] == str(env.id)
    attrs = sqs.encode(env, CE).attributes
    assert len(attrs) <= 10
    assert attrs["ce-type"]["StringValue"] == "orders"


def test_sqs_falls_back_to_structured_mode_past_ten_attributes() -> None:
    ce = CloudEvents(source="urn:svc", types={"orders": "placed"})  # one attribute more
    env = _envelope(b"\x00binary", "application/octet-stream")  # and outbox-body
    message = sqs.encode(env, ce)
    assert message.attributes["content-type"]["StringValue"] == "application/cloudevents+json"
    assert len(message.attributes) <= 10
    assert sqs.decode(message.body, message.attributes) == env


# ---- the official SDK, reading ours and writing its own ---------------------------------


def _sdk() -> Any:
    from tests.support.services import import_or_missing

    return import_or_missing("cloudevents.core.bindings.kafka", "test")


def _check_sdk_event(event: Any, env: Envelope) -> None:
    assert event.get_specversion() == "1.0"
    assert event.get_id() == str(env.id)
    assert event.get_source() == CE.source
    assert event.get_type() == env.topic
    assert event.get_subject() == env.key
    assert event.get_time() == env.created_at
    assert event.get_datacontenttype() == "application/json"
    assert event.get_extension("sequence") == f"{env.seq:019d}"
    assert event.get_extension("traceparent") == env.traceparent
    assert event.get_data() == {"total": 42}


def test_the_sdk_reads_what_each_binding_writes() -> None:
    _sdk()
    from cloudevents.core.bindings import amqp as sdk_amqp
    from cloudevents.core.bindings import http as sdk_http
    from cloudevents.core.bindings import kafka as sdk_kafka
    from cloudevents.core.bindings import rabbitmq as sdk_rabbitmq

    env = _envelope()
    k = kafka.encode(env, CE)
    event = sdk_kafka.from_binary_event(
        sdk_kafka.KafkaMessage(headers=dict(k.headers), key=k.key, value=k.value)
    )
    _check_sdk_event(event, env)
    n = nats.encode(env, CE)
    _check_sdk_event(sdk_http.from_binary_event(sdk_http.HTTPMessage(n.headers, n.data)), env)
    r = rabbitmq.encode(env, CE)
    _check_sdk_event(sdk_rabbitmq.from_binary_event(
        sdk_rabbitmq.RabbitMQMessage(r.headers, r.content_type, r.body)), env)  # fmt: skip
    a = amqp1.encode(env, CE)
    _check_sdk_event(sdk_amqp.from_binary_event(sdk_amqp.AMQPMessage(
        {"content-type": a.content_type}, a.properties, a.body)), env)  # fmt: skip
    s = sqs.encode(env, CE)
    attrs = {name: a["StringValue"] for name, a in s.attributes.items()}
    _check_sdk_event(sdk_http.from_binary_event(
        sdk_http.HTTPMessage(attrs, s.body.encode())), env)  # fmt: skip
    structured = CloudEvents(source=CE.source, structured=True)
    k = kafka.encode(env, structured)
    message = sdk_kafka.KafkaMessage(headers=dict(k.headers), key=k.key, value=k.value)
    _check_sdk_event(sdk_kafka.from_structured_event(message), env)


def test_an_sdk_event_of_another_producer_is_applied_once_per_source_and_id() -> None:
    _sdk()
    from cloudevents.core.bindings import kafka as sdk_kafka
    from cloudevents.core.v1.event import CloudEvent

    event = CloudEvent({"type": "com.example.shipped", "source": "/warehouse", "id": "A-17",
                        "subject": "parcel 9"}, {"parcel": 9})  # fmt: skip
    message = sdk_kafka.to_binary_event(event)
    env = kafka.decode(list(message.headers.items()), message.value)
    assert env.id == uuid.uuid5(FOREIGN_NAMESPACE, "/warehouse\nA-17")
    assert env.topic == "com.example.shipped"
    assert env.key == str(env.id)  # a key of its own: nothing to wait for
    assert env.seq == 1
    assert env.headers["ce-subject"] == "parcel 9"
    assert env.headers["ce-source"] == "/warehouse"
    assert env.payload == b'{"parcel": 9}'
    again = kafka.decode(list(message.headers.items()), message.value)
    assert again.id == env.id  # a redelivery is the same message
    other = CloudEvent({"type": "com.example.shipped", "source": "/elsewhere", "id": "A-17"})
    assert kafka.decode(list(sdk_kafka.to_binary_event(other).headers.items()), b"").id != env.id


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"ce_specversion": b"0.3", "ce_id": b"1", "ce_source": b"s", "ce_type": b"t"},
         "bad_format"),
        ({"ce_specversion": b"1.0", "ce_source": b"s", "ce_type": b"t"}, "missing_header"),
        ({"ce_specversion": b"1.0", "ce_id": str(uuid.uuid4()).encode(), "ce_source": b"s",
          "ce_type": b"t", "ce_subject": b"k", "ce_sequence": b"-3"}, "bad_seq"),
        ({"content-type": b"application/cloudevents+json"}, "bad_format"),
    ],
)  # fmt: skip
def test_a_malformed_cloudevent_is_refused_with_a_reason(
    headers: dict[str, bytes], reason: str
) -> None:
    with pytest.raises(InvalidMessageError) as caught:
        kafka.decode(list(headers.items()), b"{not json")
    assert caught.value.data["reason"] == reason
