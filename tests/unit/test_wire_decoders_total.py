"""Every decoder is total and bounded (hypothesis, pure logic, 10,000 examples per decoder).

Whatever a broker hands a consumer (any header map, any body, hostile sizes: a seq of 100,000
digits, a thousand headers, a megabyte-long value, bytes that are not UTF-8, a structure no
client hands over), each wire module's ``decode``, ``Envelope.from_headers`` and the WAL
record decoder return a valid envelope (record) or raise ``InvalidMessageError`` with a reason
from ``REFUSAL_REASONS``, never another exception (which would end a consumer's ``run()`` and
have the broker redeliver the message to the next one, in a loop), and each call stays fast
(its work is bounded before it grows with the input).
"""

from __future__ import annotations

import gc
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox._capture import WalRecord, decode_record, encode_record
from outbox._limits import MAX_KEY_BYTES, MAX_TOPIC_BYTES
from outbox.envelope import (
    HEADER_CONTENT_TYPE,
    HEADER_CREATED_AT,
    HEADER_ID,
    HEADER_KEY,
    HEADER_SEQ,
    HEADER_TOPIC,
    HEADER_TRACEPARENT,
    REFUSAL_REASONS,
    Envelope,
)
from outbox.exceptions import InvalidMessageError
from outbox.wire import jsonl, kafka, mqtt, nats, rabbitmq, redis

#: per decoder; the issue's bar, kept here (fast: pure logic, small inputs mostly)
EXAMPLES = 10_000
#: the most CPU one call may take: generous (a garbage collection may fall in it), far below
#: what the work of a hostile input costs unbounded (int() of 100,000 digits: about 0.1 s,
#: a million headers: seconds)
MAX_CALL_SECONDS = 0.1
SLOWEST: dict[str, float] = {}

#: about a minute of CPU for the two tests (10,000 examples each; every example runs every
#: wire module): slow, and given room beyond the suite's 300 s timeout on a busy machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROFILE = settings(
    max_examples=EXAMPLES,
    deadline=None,  # timed below, per call, without hypothesis's own overhead
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_short = st.text(max_size=12)
# long strings, made once: just below and past the bounds, and far past them
_huge = st.sampled_from(
    [c * n for n in (20, 256, 1025, 20_000, 100_000) for c in ("9", "k", "é", "\x00", " ")]
)
_seq = st.one_of(
    st.integers(-5, 2**70).map(str),
    st.sampled_from(["-3", "abc", "1e9", "0", "+1", " 1", "1 ", "1_000", "٣", "²", ""]),
    st.sampled_from(["9" * n for n in (19, 20, 4_301, 5_000, 100_000)]),
    _short,
)
_ids = st.one_of(st.uuids().map(str), st.sampled_from(["not-a-uuid", "", "{}"]), _short)
_names = st.one_of(st.sampled_from(["t", "orders", " ", "\x00", "k\x00"]), _short, _huge)
_created = st.one_of(
    st.datetimes().map(lambda d: d.isoformat()),
    st.sampled_from(["yesterday", "2026-13-01", "9" * 5_000]),
    _short,
)
_envelope_values: dict[str, st.SearchStrategy[str]] = {
    HEADER_ID: _ids,
    HEADER_TOPIC: _names,
    HEADER_KEY: _names,
    HEADER_SEQ: _seq,
    HEADER_CREATED_AT: _created,
    HEADER_CONTENT_TYPE: st.one_of(st.just("application/json"), _short, _huge),
    HEADER_TRACEPARENT: st.one_of(_short, _huge),
}
# a header count at the limit, just past it, far past it (made once: shared, never changed)
_many = st.sampled_from([{f"x-h{i}": "v" for i in range(n)} for n in (0, 70, 81, 2_000)])

_valid = st.fixed_dictionaries(
    {
        HEADER_ID: st.uuids().map(str),
        HEADER_TOPIC: st.sampled_from(["orders", "t" * 255, "é" * 127]),
        HEADER_KEY: st.sampled_from(["order-1", "k" * 1024]),
        HEADER_SEQ: st.integers(1, 2**63 - 1).map(str),
    },
    optional={
        HEADER_CREATED_AT: st.datetimes().map(lambda d: d.isoformat()),
        HEADER_CONTENT_TYPE: st.just("application/json"),
    },
)
#: what to do to a valid envelope's headers: replace a header (with a valid value or a
#: hostile one), or drop it (None)
_changes = st.lists(
    st.sampled_from(sorted(_envelope_values)).flatmap(
        lambda name: st.tuples(st.just(name), st.none() | _envelope_values[name])
    ),
    max_size=2,
)


def _changed(
    valid: dict[str, str], changes: list[tuple[str, str | None]], upper: bool,
    extra: dict[str, str], many: dict[str, str],
) -> dict[str, str]:  # fmt: skip
    headers = dict(valid)
    for name, value in changes:
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    cased = {(k.upper() if upper else k): v for k, v in headers.items()}
    return {**many, **extra, **cased}


#: header maps as text: a valid envelope's, mostly, with a change or two (so every check is
#: reached, not only the first), any case, some user headers, sometimes very many
text_headers = st.builds(
    _changed,
    _valid,
    _changes,
    st.booleans(),
    st.dictionaries(_short, st.one_of(_short, _huge), max_size=3),
    st.one_of(st.just({}), _many, st.sampled_from([{"x" * 256: "v"}, {"é" * 128: "v"}])),
)
_bad_utf8 = st.sampled_from([b"\xff", b"\xc3", b"abc\xed\xa0\x80", b"\x80" * 20])
#: a header value as a client that hands bytes may give it
byte_values = st.one_of(
    st.binary(max_size=16), _bad_utf8, st.sampled_from([b"9" * 5_000, b"x" * 100_000])
)
#: the consumers' max_payload_bytes in these tests: some bodies are larger
LIMIT = 1024
bodies = st.one_of(st.binary(max_size=64), st.sampled_from([b"x" * LIMIT, b"x" * (LIMIT + 1)]))


def _as_bytes(headers: dict[str, str], data: st.DataObject) -> dict[str, bytes]:
    out = {k: v.encode("utf-8", "surrogatepass") for k, v in headers.items()}
    if headers and data.draw(st.booleans()):  # one value replaced by raw bytes
        name = data.draw(st.sampled_from(sorted(out)))
        out[name] = data.draw(byte_values)
    return out


def _run(decode: Callable[[], Any]) -> tuple[Any, InvalidMessageError | None, float]:
    """``decode()``'s result or refusal, and the CPU time of this thread it took."""
    started = time.thread_time()  # not other processes' load, nor other threads'
    gc.disable()  # the decoder's work, not a collection of what hypothesis made
    try:
        return decode(), None, time.thread_time() - started
    except InvalidMessageError as exc:
        return None, exc, time.thread_time() - started
    finally:
        gc.enable()


def _total(name: str, decode: Callable[[], Any]) -> Any:
    """Run ``decode``: a result, or None when refused with a known reason; timed."""
    result, refused, took = _run(decode)
    if refused is not None:
        assert refused.data.get("reason") in REFUSAL_REASONS, refused
        assert str(refused)
    if took >= MAX_CALL_SECONDS:  # a slow input is slow every time; a hiccup is not
        took = min(took, *(_run(decode)[2] for _ in range(3)))
    SLOWEST[name] = max(SLOWEST.get(name, 0.0), took)
    assert took < MAX_CALL_SECONDS, f"{name} took {took:.3f}s"
    return result


def _valid(env: Envelope | None, payload: bytes) -> None:
    if env is None:
        return
    assert isinstance(env.id, uuid.UUID)
    assert 1 <= env.seq < 2**63
    for text, limit in ((env.topic, MAX_TOPIC_BYTES), (env.key, MAX_KEY_BYTES)):
        assert text.strip()
        assert len(text.encode("utf-8", "surrogatepass")) <= limit
    assert env.payload == payload


def _from_headers(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    env = _total(
        "from_headers", lambda: Envelope.from_headers(headers, body, max_payload_bytes=LIMIT)
    )
    _valid(env, body)


def _nats(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    _valid(_total("nats", lambda: nats.decode(headers, body, max_payload_bytes=LIMIT)), body)


_amqp_values = st.one_of(
    byte_values,
    st.integers(-(2**63), 2**63 - 1),
    st.none(),
    st.lists(st.dictionaries(_short, _short, max_size=2), max_size=2),  # like x-death
)


def _rabbitmq(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    table: dict[str, object] = dict(headers)
    if headers and data.draw(st.booleans()):
        table[data.draw(st.sampled_from(sorted(headers)))] = data.draw(_amqp_values)
    _valid(_total("rabbitmq", lambda: rabbitmq.decode(table, body, max_payload_bytes=LIMIT)), body)


def _kafka(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    pairs: list[Any] = list(_as_bytes(headers, data).items())
    if data.draw(st.booleans()):  # what no client hands over: a null value, a bare item
        pairs.append(data.draw(st.sampled_from([("x-null", None), ("solo",), 7, None])))
    value = None if not body and data.draw(st.booleans()) else body  # a null record value
    _valid(_total("kafka", lambda: kafka.decode(pairs, value, max_payload_bytes=LIMIT)), body)


def _redis(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    fields: dict[Any, Any] = (
        dict(_as_bytes(headers, data)) if data.draw(st.booleans()) else (dict(headers))
    )
    form = data.draw(st.sampled_from(["bytes", "str", "missing", "int"]))
    payload: Any = {"bytes": body, "missing": None, "int": 3}.get(form)
    if form == "str":
        payload = body.decode("latin-1")
    if payload is not None:
        fields[data.draw(st.sampled_from([b"payload", "payload"]))] = payload
    env = _total("redis", lambda: redis.decode(fields, max_payload_bytes=LIMIT))
    if env is not None and isinstance(payload, bytes):
        _valid(env, payload)


def _mqtt(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    props: list[Any] = list(headers.items())
    if data.draw(st.booleans()):
        props.append(data.draw(st.sampled_from([("dup", "a"), ("only",), ("n", 3), None])))
    _valid(_total("mqtt", lambda: mqtt.decode(props, body, max_payload_bytes=LIMIT)), body)


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _jsonl(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["doc", "base64", "any-json", "text", "deep"]))
    if kind == "doc":
        doc: Any = {"destination": data.draw(_short), "headers": headers,
                    "payload": data.draw(_short)}  # fmt: skip
        line = json.dumps(doc)
    elif kind == "base64":
        doc = {"destination": "d", "headers": headers,
               "payload_base64": data.draw(st.sampled_from(["e30=", "!!", "e30", ""]))}  # fmt: skip
        line = json.dumps(doc)
    elif kind == "any-json":
        line = json.dumps(data.draw(_json_values))
    elif kind == "text":
        line = data.draw(st.text(max_size=40))
    else:  # nesting deeper than the parser's recursion limit
        line = "[" * data.draw(st.sampled_from([10, 100_000])) + "]"
    _total("jsonl", lambda: jsonl.decode(line, max_payload_bytes=LIMIT))


def _amqp1(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    from outbox.wire import amqp1

    props: dict[Any, Any] = dict(_as_bytes(headers, data)) if data.draw(st.booleans()) else (
        dict(headers))  # fmt: skip
    if headers and data.draw(st.booleans()):  # what proton may hand over from a foreign sender
        props[data.draw(st.sampled_from(sorted(headers)))] = data.draw(
            st.one_of(_amqp_values, st.uuids(), st.floats(), st.booleans())
        )
    form = data.draw(st.sampled_from(["bytes", "memoryview", "none", "str", "list"]))
    value: Any = {"bytes": body, "memoryview": memoryview(body), "none": None, "str": "text",
                  "list": [body]}[form]  # fmt: skip
    env = _total("amqp1", lambda: amqp1.decode(props, value, max_payload_bytes=LIMIT))
    if form in ("bytes", "memoryview"):
        _valid(env, body)


DECODERS = [_from_headers, _nats, _rabbitmq, _kafka, _redis, _mqtt, _jsonl]
DECODERS += [_amqp1]


@PROFILE
@given(headers=text_headers, body=bodies, data=st.data())
def test_every_wire_decoder(headers: dict[str, str], body: bytes, data: st.DataObject) -> None:
    """One example, every wire module: each decodes the same header map and body, as its
    broker's client hands them over (bytes, tables, pairs), with its own malformations."""
    for decoder in DECODERS:
        decoder(headers, body, data)


def _record(topic: str, key: str, headers: str, payload: bytes) -> bytes:
    return encode_record(
        id=uuid.uuid4(), topic=topic, key=key, content_type="application/json",
        traceparent=None, headers=headers, payload=payload, available_at=None,
        idempotent=False,
    )  # fmt: skip


_wal_headers = st.one_of(
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4).map(
        lambda h: orjson.dumps(h).decode()
    ),
    st.sampled_from(["{}", "", "[]", "not json", '{"a": 1}', '{"a": "\\u0000"}', "{" * 10_000]),
    st.integers(0, 200).map(lambda n: json.dumps({f"h{i}": "v" for i in range(n)})),
)


@PROFILE
@given(
    topic=_names, key=_names, headers=_wal_headers, payload=st.binary(max_size=32),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 400) | st.none(), noise=st.binary(max_size=64) | st.none(),
)  # fmt: skip
def test_wal_record(
    topic: str,
    key: str,
    headers: str,
    payload: bytes,
    flips: list[tuple[int, int]],
    cut: int | None,
    noise: bytes | None,
) -> None:
    """A record a writer of another version (or a hand-made logical message under our prefix)
    put in the WAL: the relay skips it with its reason instead of failing its batch on every
    retry (a NUL or an oversized key would fail the insert; bad JSON headers the envelope)."""
    if noise is not None:
        data = noise
    else:
        data = bytearray(_record(topic, key, headers, payload))
        for at, byte in flips:
            if at < len(data):
                data[at] = byte
        data = data[:cut] if cut is not None else data
    record = _total("wal", lambda: decode_record(bytes(data)))
    if isinstance(record, WalRecord):
        assert record.topic.strip()
        assert "\x00" not in record.topic
        assert len(record.topic.encode()) <= MAX_TOPIC_BYTES
        assert len(record.key.encode()) <= MAX_KEY_BYTES
        parsed = orjson.loads(record.headers) if record.headers not in ("", "{}") else {}
        assert isinstance(parsed, dict)
        assert all(isinstance(v, str) and "\x00" not in v for v in parsed.values())


@pytest.fixture(scope="module", autouse=True)
def _report_slowest() -> Any:
    yield
    print("\nslowest call per decoder (s):",
          {k: round(v, 4) for k, v in sorted(SLOWEST.items())})  # fmt: skip
