"""CloudEvents 1.0 on every broker: how an envelope becomes an event, and an event an envelope.

With ``format = "cloudevents"`` (an adapter's ``cloudevents=CloudEvents(source=...)``), a
message travels in CloudEvents *binary content mode*, following each protocol binding: the
body is the payload as it is, ``datacontenttype`` is the broker's content type, and every
other attribute is a header named by the binding's prefix:

==========  ======================  ==================================================
broker      attribute names         ``datacontenttype``
==========  ======================  ==================================================
Kafka       ``ce_<name>`` headers   ``content-type`` header (Kafka binding)
NATS        ``ce-<name>`` headers   ``content-type`` header (NATS binding)
RabbitMQ    ``ce-<name>`` headers   ``content_type`` property (RabbitMQ binding)
AMQP 1.0    ``cloudEvents_<name>``  ``content-type`` property (AMQP binding)
            application-properties
MQTT 5      ``<name>`` user         ``content_type`` property (MQTT binding)
            properties
SQS, SNS    ``ce-<name>`` message   ``content-type`` attribute (no binding exists: the
            attributes              HTTP binding's names)
Redis       ``ce_<name>`` fields    ``content-type`` field (no binding exists)
==========  ======================  ==================================================

NATS and SQS values are percent-encoded as the HTTP binding says (a space, ``"``, ``%`` and
anything outside printable ASCII); the other bindings carry them as they are. The
``content-type`` header also travels where the binding puts it in a property (RabbitMQ, MQTT,
AMQP 1.0), for readers that see headers only.

The attributes: ``specversion`` 1.0; ``id`` = the outbox id; ``source`` from the
configuration; ``type`` = the topic (or ``types[topic]``); ``subject`` = the key; ``time`` =
the message's ``created_at`` (its transaction's time); ``sequence`` = the key's seq, as the
sequence extension wants it (a lexicographically ordered string: 19 digits, zero-padded);
``traceparent`` (the distributed tracing extension) when there is one; and ``outboxtopic``,
the topic, when ``type`` is mapped to something else. User headers travel beside them as
headers (on SQS in the ``outbox-headers`` attribute, as always).

*Structured content mode* (``structured=True``) puts the whole event in the body as JSON
(``application/cloudevents+json``; ``data`` for a JSON payload, else ``data_base64``).

Reading: a consumer accepts our envelope, binary mode and structured mode on every broker, so
a topic switches format with no downtime. An event with a ``sequence``, a UUID ``id`` and a
``subject`` is one of ours: it keeps its id, key and seq (ordered). Any other event (another
producer's) is applied unordered and once per ``id`` + ``source``: its message id is the
UUID v5 of both, its key that id (a key of its own, so no order is waited for) and its seq 1;
its attributes reach the handler as ``ce-<name>`` headers.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import re
import uuid
from collections.abc import Mapping
from urllib.parse import quote, unquote

import orjson

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES
from outbox.envelope import (
    HEADER_CONTENT_TYPE,
    HEADER_CREATED_AT,
    HEADER_ID,
    HEADER_KEY,
    HEADER_ORIGIN,
    HEADER_SEQ,
    HEADER_TOPIC,
    HEADER_TRACEPARENT,
    Envelope,
    is_reserved_header,
    shown,
)
from outbox.exceptions import ConfigurationError, InvalidMessageError

__all__ = [
    "AMQP",
    "HTTP_LIKE",
    "KAFKA",
    "MQTT",
    "RABBITMQ",
    "REDIS",
    "SPECVERSION",
    "STRUCTURED_CONTENT_TYPE",
    "Binding",
    "CloudEvents",
    "decode",
    "detect",
]

SPECVERSION = "1.0"
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
#: the namespace of the message ids given to other producers' events (UUID v5 of source, id)
FOREIGN_NAMESPACE = uuid.UUID("9b8c0f4e-3f1d-5b7a-9a53-0c1b5d3e7f21")
#: the extension holding the topic when ``type`` is mapped to another name
TOPIC_EXTENSION = "outboxtopic"
#: the extension naming the database the message came from (``Envelope.origin``): an ordered
#: consumer keeps one position per origin, topic and key
ORIGIN_EXTENSION = "outboxorigin"
#: attribute names a CloudEvents decoder takes as attributes where they carry no prefix (MQTT)
KNOWN_ATTRIBUTES = frozenset({
    "specversion", "id", "source", "type", "subject", "time", "datacontenttype",
    "dataschema", "sequence", "traceparent", "tracestate", TOPIC_EXTENSION, ORIGIN_EXTENSION,
})  # fmt: skip
_SEQ_WIDTH = 19  # digits of the largest seq (2**63 - 1): the sequence extension's order
# what the HTTP binding leaves as it is: printable ASCII but space, '"' and '%'
_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%')


@dataclasses.dataclass(frozen=True, slots=True)
class Binding:
    """How one broker's protocol binding names the attributes."""

    prefix: str
    percent_encoded: bool = False


KAFKA = Binding("ce_")
HTTP_LIKE = Binding("ce-", percent_encoded=True)  # NATS, SQS/SNS
RABBITMQ = Binding("ce-")
AMQP = Binding("cloudEvents_")
MQTT = Binding("")
REDIS = Binding("ce_")


@dataclasses.dataclass(frozen=True)
class CloudEvents:
    """The relay's CloudEvents format: ``source`` (a URI-reference naming this service),
    ``types`` (topic -> event type; the topic by default), ``topics`` (the topics written as
    CloudEvents; ``None``: all), ``structured`` (structured content mode instead of binary)."""

    source: str
    types: Mapping[str, str] = dataclasses.field(default_factory=dict)
    topics: frozenset[str] | None = None
    structured: bool = False
    #: per binding: what :meth:`headers` makes once (names, source, each topic's type)
    _made: dict[Binding, tuple[tuple[str, ...], str, dict[str, str]]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConfigurationError(
                "CloudEvents source must be a non-empty URI-reference, such as "
                "'//orders.example.com' or 'urn:orders'"
            )
        for topic, name in self.types.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"CloudEvents type for topic {topic!r} must be text")
        if self.topics is not None:
            object.__setattr__(self, "topics", frozenset(self.topics))

    def applies(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    def attributes(self, envelope: Envelope) -> dict[str, str]:
        """The event's attributes but ``datacontenttype``, as text, in the spec's order."""
        topic = envelope.topic
        kind = self.types.get(topic, topic)
        out = {"specversion": SPECVERSION, "id": str(envelope.id), "source": self.source,
               "type": kind, "subject": envelope.key}  # fmt: skip
        if envelope.created_at is not None:
            out["time"] = _rfc3339(envelope.created_at)
        out["sequence"] = str(envelope.seq).zfill(_SEQ_WIDTH)
        if envelope.traceparent:
            out["traceparent"] = envelope.traceparent
        if kind != topic:
            out[TOPIC_EXTENSION] = topic
        if envelope.origin:
            out[ORIGIN_EXTENSION] = envelope.origin
        return out

    def headers(self, envelope: Envelope, binding: Binding) -> dict[str, str]:
        """Binary mode: the user's headers, the prefixed attributes and ``content-type``.

        The relay's hot path: the names, the source and each topic's type are made once per
        binding, and only the key is looked at for characters to percent-encode."""
        names, source, kinds = self._binding(binding)
        topic = envelope.topic
        kind = kinds.get(topic)
        if kind is None:
            kind = kinds[topic] = _quoted(self.types.get(topic, topic), binding.percent_encoded)
        out = dict(envelope.headers)
        out[names[0]] = SPECVERSION
        out[names[1]] = str(envelope.id)
        out[names[2]] = source
        out[names[3]] = kind
        key = envelope.key
        out[names[4]] = _quoted(key, True) if binding.percent_encoded else key
        if envelope.created_at is not None:
            out[names[5]] = _rfc3339(envelope.created_at)
        out[names[6]] = str(envelope.seq).zfill(_SEQ_WIDTH)
        if envelope.traceparent:  # hex digits and dashes: nothing to encode
            out[names[7]] = envelope.traceparent
        if topic in self.types:
            out[names[8]] = _quoted(topic, binding.percent_encoded)
        if envelope.origin:
            out[names[9]] = _quoted(envelope.origin, binding.percent_encoded)
        out[HEADER_CONTENT_TYPE] = envelope.content_type
        return out

    def _binding(self, binding: Binding) -> tuple[tuple[str, ...], str, dict[str, str]]:
        """(attribute names, source, types by topic) as ``binding`` writes them, made once."""
        made = self._made.get(binding)
        if made is None:
            names = tuple(binding.prefix + name for name in _ORDER)
            made = self._made[binding] = (
                names, _quoted(self.source, binding.percent_encoded), {}
            )
        return made

    def structured_body(self, envelope: Envelope) -> bytes:
        """Structured mode: the event as JSON (the payload as ``data`` when it is JSON)."""
        event: dict[str, object] = dict(self.attributes(envelope))
        event["datacontenttype"] = envelope.content_type
        if _is_json(envelope.content_type) and envelope.payload:
            event["data"] = orjson.Fragment(envelope.payload)
        else:
            event["data_base64"] = base64.b64encode(envelope.payload).decode("ascii")
        return orjson.dumps(event)

    def structured_headers(self, envelope: Envelope) -> dict[str, str]:
        out = {k: v for k, v in envelope.headers.items() if not is_reserved_header(k)}
        out[HEADER_CONTENT_TYPE] = STRUCTURED_CONTENT_TYPE
        return out


_ORDER = ("specversion", "id", "source", "type", "subject", "time", "sequence", "traceparent",
          TOPIC_EXTENSION, ORIGIN_EXTENSION)  # fmt: skip
# anything but what the HTTP binding leaves as it is
_NEEDS_QUOTING = re.compile(r'[^\x21\x23\x24\x26-\x7e]')


def _quoted(value: str, percent_encoded: bool) -> str:
    if percent_encoded and _NEEDS_QUOTING.search(value):
        return quote(value, safe=_SAFE)
    return value


def _is_json(content_type: str) -> bool:
    base = content_type.split(";", 1)[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


def _rfc3339(when: dt.datetime) -> str:
    text = when.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def detect(headers: Mapping[str, str], binding: Binding) -> bool:
    """Whether a message whose headers are ``headers`` is a CloudEvent:
    binary mode (the binding's ``specversion``) or structured mode (its content type)."""
    name = binding.prefix + "specversion"
    if name in headers or name.lower() in headers:
        return True
    ctype = headers.get(HEADER_CONTENT_TYPE)
    return ctype is not None and ctype.lower().startswith(STRUCTURED_CONTENT_TYPE)


def decode(
    headers: Mapping[str, str],
    payload: bytes,
    binding: Binding,
    *,
    max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    content_type: str | None = None,
) -> Envelope:
    """The envelope of a CloudEvent in binary or structured mode; ``headers`` by their received
    names; ``content_type`` is the broker's content type property where it has one.
    InvalidMessageError (with a reason) for anything that is not a valid event."""
    lowered = {name.lower(): (name, value) for name, value in headers.items()}
    ctype = content_type or lowered.get(HEADER_CONTENT_TYPE, ("", ""))[1]
    prefix = binding.prefix.lower()
    if (prefix + "specversion") not in lowered and ctype.lower().startswith(
        STRUCTURED_CONTENT_TYPE
    ):
        if len(payload) > max_payload_bytes:
            raise InvalidMessageError(
                f"CloudEvent of {len(payload)} bytes is above the consumer's max_payload_bytes="
                f"{max_payload_bytes}",
                reason="payload_too_large",
            )
        attributes, data = _structured(payload)
        user = {n: v for n, v in headers.items() if n.lower() != HEADER_CONTENT_TYPE}
        return _envelope(attributes, user, data, max_payload_bytes)
    attributes = {}
    user = {}
    for low, (name, value) in lowered.items():
        if prefix and low.startswith(prefix):
            attr = low[len(prefix) :]
            attributes[attr] = unquote(value) if binding.percent_encoded else value
        elif not prefix and low in KNOWN_ATTRIBUTES:
            attributes[low] = value
        elif low != HEADER_CONTENT_TYPE and low != "nats-msg-id":
            user[name] = value
    if ctype:
        attributes.setdefault("datacontenttype", ctype)
    return _envelope(attributes, user, payload, max_payload_bytes)


def _structured(body: bytes) -> tuple[dict[str, str], bytes]:
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessageError(
            f"structured CloudEvent is not JSON: {exc}", reason="bad_format"
        ) from None
    if not isinstance(event, dict):
        raise InvalidMessageError("structured CloudEvent is not a JSON object", reason="bad_format")
    try:
        if "data_base64" in event:
            data = base64.b64decode(event.pop("data_base64"), validate=True)
        elif "data" in event:
            value = event.pop("data")
            data = value.encode() if isinstance(value, str) and not _is_json(
                str(event.get("datacontenttype", "application/json"))
            ) else orjson.dumps(value)  # fmt: skip
        else:
            data = b""
    except (binascii.Error, TypeError, ValueError) as exc:
        raise InvalidMessageError(
            f"structured CloudEvent has unreadable data: {exc}", reason="bad_format"
        ) from None
    attributes = {str(k).lower(): v if isinstance(v, str) else orjson.dumps(v).decode()
                  for k, v in event.items()}  # fmt: skip
    return attributes, data


def _envelope(
    attributes: dict[str, str], user: dict[str, str], payload: bytes, max_payload_bytes: int
) -> Envelope:
    version = attributes.get("specversion")
    if version != SPECVERSION:
        raise InvalidMessageError(
            f"CloudEvent specversion {shown(version)} is not {SPECVERSION}", reason="bad_format"
        )
    missing = [a for a in ("id", "source", "type") if not attributes.get(a)]
    if missing:
        raise InvalidMessageError(
            f"CloudEvent lacks the attribute(s) {', '.join(missing)}",
            reason="missing_header",
            missing=missing,
        )
    event_id, source, kind = attributes["id"], attributes["source"], attributes["type"]
    sequence, subject = attributes.get("sequence", ""), attributes.get("subject")
    headers: dict[str, str] = {}
    ours = bool(sequence) and bool(subject) and _is_uuid(event_id)
    if ours:
        digits = sequence.lstrip("0") or "0"
        headers.update({HEADER_ID: event_id, HEADER_TOPIC: attributes.get(TOPIC_EXTENSION, kind),
                        HEADER_KEY: subject or "", HEADER_SEQ: digits})  # fmt: skip
        if attributes.get(ORIGIN_EXTENSION):
            headers[HEADER_ORIGIN] = attributes[ORIGIN_EXTENSION]
    else:
        # another producer's event: once per (source, id), in no order
        msg_id = str(uuid.uuid5(FOREIGN_NAMESPACE, f"{source}\n{event_id}"))
        headers.update({HEADER_ID: msg_id, HEADER_TOPIC: kind, HEADER_KEY: msg_id,
                        HEADER_SEQ: "1"})  # fmt: skip
        for name, value in attributes.items():
            if name not in ("specversion", "datacontenttype", "traceparent"):
                user[f"ce-{name}"] = value
    if attributes.get("time"):
        headers[HEADER_CREATED_AT] = attributes["time"]
    if attributes.get("traceparent"):
        headers[HEADER_TRACEPARENT] = attributes["traceparent"]
    headers[HEADER_CONTENT_TYPE] = attributes.get("datacontenttype") or "application/json"
    for name, value in user.items():
        if not is_reserved_header(name):
            headers[name] = value
    return Envelope.from_headers(headers, payload, max_payload_bytes=max_payload_bytes)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
