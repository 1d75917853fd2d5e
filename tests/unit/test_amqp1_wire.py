"""AMQP 1.0: the wire mapping, its total decoder, and the URL (no password anywhere shown)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox import amqp1_reactor as _proton
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError, InvalidMessageError
from outbox.wire import amqp1
from relay.exceptions import RetryablePublishError


def _env(**fields: Any) -> Envelope:
    base: dict[str, Any] = {"id": uuid.uuid4(), "topic": "orders", "key": "o-1", "seq": 3,
                            "payload": b"{}"}  # fmt: skip
    return Envelope(**{**base, **fields})


def test_encode_maps_id_key_seq_topic_and_content_type() -> None:
    env = _env(headers={"tenant": "acme"}, content_type="application/json")
    m = amqp1.encode(env)
    assert (m.message_id, m.group_id, m.group_sequence, m.subject) == (str(env.id), "o-1", 3,
                                                                       "orders")  # fmt: skip
    assert m.content_type == "application/json"
    assert m.properties["tenant"] == "acme"
    assert m.properties["outbox-seq"] == "3"
    assert amqp1.decode(m.properties, m.body) == env


def test_encode_leaves_out_what_amqp_types_cannot_hold() -> None:
    m = amqp1.encode(_env(seq=2**32, content_type="text/plain; charset=ütf"))
    assert m.group_sequence is None  # sequence-no is 32 bits; outbox-seq holds it
    assert m.content_type is None  # a symbol is ASCII; the property holds it
    assert amqp1.decode(m.properties, m.body).seq == 2**32


def test_decode_reads_memoryview_bodies_and_binary_or_numeric_values() -> None:
    env = _env()
    props: dict[Any, Any] = {k: v.encode() for k, v in amqp1.encode(env).properties.items()}
    props["outbox-seq"] = 3
    assert amqp1.decode(props, memoryview(b"{}")) == env
    assert amqp1.decode(amqp1.encode(_env(payload=b"")).properties, None).payload == b""


@pytest.mark.parametrize(
    ("properties", "body", "reason"),
    [
        ({}, "a string body", "bad_format"),
        ({}, [b"a sequence"], "bad_format"),
        (["not", "a", "map"], b"", "bad_format"),
        ({f"h{i}": "v" for i in range(81)}, b"", "too_many_headers"),
        ({"nested": {"a": "b"}}, b"", "bad_format"),
        ({"id": uuid.uuid4()}, b"", "bad_format"),
        ({"long": "x" * 20_000}, b"", "bad_header"),
        ({"bin": b"\xff\xfe"}, b"", "not_utf8"),
        ({}, b"", None),  # no outbox headers
    ],
)
def test_decode_refuses_what_the_relay_never_sends(
    properties: Any, body: Any, reason: str | None
) -> None:
    with pytest.raises(InvalidMessageError) as caught:
        amqp1.decode(properties, body)
    if reason is not None:
        assert caught.value.data["reason"] == reason


_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary()
            | st.uuids())  # fmt: skip
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(properties=_values | st.dictionaries(_scalars, _values, max_size=6), body=_values)
def test_decode_is_total(properties: Any, body: Any) -> None:
    with contextlib.suppress(InvalidMessageError):
        amqp1.decode(properties, body)


_VALID = amqp1.encode(_env(created_at=None, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(_VALID.properties)), value=_values)
def test_decode_of_a_valid_message_with_one_value_changed_is_total(name: str, value: Any) -> None:
    with contextlib.suppress(InvalidMessageError):
        amqp1.decode({**_VALID.properties, name: value}, _VALID.body)


def test_url_parts_and_tls_default_port() -> None:
    ep = _proton.endpoint("amqp1s://RootManageSharedAccessKey:a%2Fb%2Bc%3D@ns.example.net")
    assert (ep.host, ep.port, ep.tls) == ("ns.example.net", 5671, True)
    assert ep.password == "a/b+c="  # a SAS key's characters, percent-escaped in the URL
    assert "a/b" not in ep.shown()
    assert "a%2F" not in ep.shown()
    assert _proton.endpoint("amqp1://h").port == 5672
    assert _proton.endpoint("amqp1://h").user is None


@pytest.mark.parametrize("url", ["amqp1://u:s3cret@h:5672/queue", "amqp1://u:s3cret@h:x"])
def test_url_errors_say_what_to_fix_without_the_password(url: str) -> None:
    from relay.brokers import publisher_for_url

    with pytest.raises(ConfigurationError) as caught:
        publisher_for_url(url)
    assert "s3cret" not in str(caught.value)


def test_unreachable_broker_error_has_no_password() -> None:
    from relay.brokers import publisher_for_url

    pub = publisher_for_url("amqp1://svc:s3cret@127.0.0.1:1", connect_timeout=1)

    async def body() -> None:
        with pytest.raises(RetryablePublishError) as caught:
            await pub.start()
        assert "s3cret" not in str(caught.value)
        assert "svc@127.0.0.1:1" in str(caught.value)

    asyncio.run(body())
