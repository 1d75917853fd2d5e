"""The size limits of a message, in one place: what ``publish()`` accepts is what every decoder
(the brokers' wire modules, the envelope, the WAL record) accepts, and nothing larger.

A decoder reads input an attacker may have written straight to the broker, so it checks these
bounds before it does any work that grows with the input (``int()`` of a long digit string is
quadratic; a header map of a million entries costs a million of everything after it).
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_RECEIVE_BYTES",
    "MAX_CONTENT_TYPE_BYTES",
    "MAX_CREATED_AT_CHARS",
    "MAX_HEADERS",
    "MAX_HEADER_NAME_BYTES",
    "MAX_HEADER_VALUE_BYTES",
    "MAX_KEY_BYTES",
    "MAX_RECEIVED_HEADERS",
    "MAX_SEQ_DIGITS",
    "MAX_TOPIC_BYTES",
]

#: NATS's default max_payload and Kafka's default message.max.bytes are both about 1 MB: a
#: larger message would be accepted by ``publish()`` and then rejected by the broker, so it is
#: refused at once (``publish(max_payload_bytes=...)`` raises it).
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

#: The consumers' default bound on a received body (``max_payload_bytes=`` of each broker
#: consumer): well above what ``publish()`` sends by default, so a producer that raised its
#: limit within the brokers' usual ones is still read, while a body no producer sent (a
#: hostile one) is refused before the handler or the database sees it.
DEFAULT_MAX_RECEIVE_BYTES = 16 * 1024 * 1024

#: Longest topic and key, in UTF-8 bytes. Both go into btree indexes (the outbox's and the
#: inbox's), whose entries PostgreSQL caps at about 2.7 kB: a longer one would fail inside the
#: caller's transaction and abort it. Brokers cap names too (a Kafka topic: 249 characters).
MAX_TOPIC_BYTES = 255
MAX_KEY_BYTES = 1024
#: A content type is a short MIME name.
MAX_CONTENT_TYPE_BYTES = MAX_TOPIC_BYTES

#: User headers per message, and the size of each name and value in UTF-8 bytes. A message's
#: headers and body together are bounded by ``max_payload_bytes`` too.
MAX_HEADERS = 64
MAX_HEADER_NAME_BYTES = 255
MAX_HEADER_VALUE_BYTES = 16 * 1024
#: Header entries a decoder reads: the user's, the envelope's own (``outbox-*``,
#: ``content-type``, ``traceparent``) and a few a broker adds (``Nats-Msg-Id``, RabbitMQ's
#: ``x-death`` and ``x-first-death-*`` after a dead-lettering).
MAX_RECEIVED_HEADERS = MAX_HEADERS + 16

#: ``outbox-seq`` is a PostgreSQL bigint: 2**63 - 1 has 19 digits. A longer digit string is
#: refused before ``int()`` reads it.
MAX_SEQ_DIGITS = 19
#: ``outbox-created-at`` is an ISO 8601 time (``2026-11-27T10:00:00.123456+00:00``: 32).
MAX_CREATED_AT_CHARS = 64
