"""How an envelope travels on each broker: one module per broker, both directions together.

The relay's adapters (``relay.brokers``) send what ``encode`` returns and the inbox's consumers
(``inbox``) rebuild the envelope with ``decode``; nothing else maps an envelope onto a broker's
message, so the two sides cannot drift apart. Each module is pure Python with no broker client
imported, so the mapping is testable without a broker and usable from any client.

The body is always the raw payload bytes; the envelope's fields travel as the text headers of
:meth:`outbox.envelope.Envelope.to_headers` (``outbox-id``, ``outbox-topic``, ``outbox-key``,
``outbox-seq``, ``outbox-created-at``, ``content-type``, ``traceparent``, plus the user's
headers), carried as each broker carries headers:

============  ==============================================================================
NATS          JetStream headers, plus ``Nats-Msg-Id: <id>`` for the stream's dedup window
RabbitMQ      the ``headers`` table; ``message_id`` and ``content_type`` properties
Kafka         record headers as UTF-8 bytes; record key = the outbox key (one key, one
              partition, in order); value = payload
Redis         ``XADD`` fields: the headers plus ``payload`` (the body)
MQTT 5        user properties; ``content_type`` property; payload = body
AMQP 1.0      application-properties; ``message-id`` = id, ``group-id`` = key,
              ``group-sequence`` = seq, ``subject`` = topic; body = one data section
SQS, SNS      the body (base64 when not text) and message attributes (:mod:`outbox.wire.sqs`);
              ``MessageGroupId`` from the key, ``MessageDeduplicationId`` = the id (FIFO)
JSON lines    ``{"destination", "headers", "payload" | "payload_base64"}`` (stdout and file
              sinks)
============  ==============================================================================

With ``cloudevents=`` (:mod:`outbox.wire.cloudevents`) the relay's adapters write CloudEvents
1.0 per each broker's protocol binding instead; every ``decode`` reads both.

Where a message goes (subject, exchange and routing key, stream, topic) is the relay's
configuration (:class:`relay.brokers.Destinations`), not part of the wire format.

Every ``decode`` is total: whatever a broker hands over (anyone who can write to it may have
written it), it returns a valid envelope or raises
:class:`~outbox.exceptions.InvalidMessageError` with a ``reason`` from
:data:`outbox.envelope.REFUSAL_REASONS`, checking the bounds of ``outbox._limits`` (the ones
``publish()`` applies, plus the consumer's ``max_payload_bytes``) before the work that grows
with the input.
"""

from __future__ import annotations

from outbox.wire import amqp1, cloudevents, jsonl, kafka, mqtt, nats, rabbitmq, redis

__all__ = ["amqp1", "cloudevents", "jsonl", "kafka", "mqtt", "nats", "rabbitmq", "redis"]
