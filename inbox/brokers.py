"""What a broker's consumer is made of, for the built-in brokers and a plug-in's
(:mod:`outbox.brokers`): subclass :class:`BrokerConsumer` and implement ``_consume``.

``_consume`` connects, sets ``self.ready`` once it receives, and until ``self.stopping`` hands
each broker message to the workers with ``await self._submit(Delivery(decode, settle,
where))``: ``decode()`` returns the message's :class:`~outbox.envelope.Envelope` (the broker's
wire codec) and ``settle(result)`` acknowledges it at the broker once its outcome is committed
(``result`` None: not a valid envelope, recorded dead; ``result.outcome.ack`` False: to be
delivered again). It ends with ``await self._finish_workers()`` and closes its connection.
The settings every consumer takes besides its own are :class:`ConsumerOptions`.
"""

from __future__ import annotations

from inbox._consumer import Batching, BrokerConsumer, ConsumerOptions, Delivery, ResultCallback
from inbox._runner import Outcome, Result

__all__ = [
    "Batching",
    "BrokerConsumer",
    "ConsumerOptions",
    "Delivery",
    "Outcome",
    "Result",
    "ResultCallback",
]
