"""The topic grammar: a topic is a name, never a broker address.

A producer's role may write any row it likes (``grants --producer``), while the relay
publishes with the broker credentials of the operator. Without a destination mapping the relay
sends a message to its topic as is (a NATS subject, a Kafka topic, a Redis stream key, an
MQTT topic, a queue name), so a topic that looks like a broker's own address
(``$JS.API.STREAM.DELETE.X``, ``$SYS/...``, ``$share/...``, ``_INBOX.x``, ``amq.*``,
``__consumer_offsets``, a queue URL) would let the producer steer the relay's credentials. So a
topic is checked against one grammar, the same one in ``publish()``, in SQL
(``outbox_check_topic``, migration outbox_0018) and in the relay for rows written before it:

* 1 to :data:`MAX_TOPIC_BYTES` characters, ASCII letters, digits, ``.``, ``-``, ``_``, ``/``;
* the first character is a letter or a digit (no ``$``, ``_``, ``.``, ``-``, ``/`` prefix:
  ``$SYS``, ``$JS``, ``$share``, ``_INBOX``, ``__consumer_offsets``, ``/exchange/...``);
* no reserved prefix of :data:`RESERVED_PREFIXES` (compared without case: ``amq.`` is
  RabbitMQ's).

What a destination may be beyond that is the operator's: ``relay.brokers.base.Destinations``.
"""

from __future__ import annotations

import re

from outbox._limits import MAX_TOPIC_BYTES
from outbox.exceptions import InvalidMessageError

__all__ = ["RESERVED_PREFIXES", "TOPIC_GRAMMAR", "check_topic", "topic_problem"]

#: the grammar, as a regular expression (the SQL function uses the same one)
TOPIC_GRAMMAR = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
_TOPIC = re.compile(TOPIC_GRAMMAR)

#: prefixes a broker keeps for itself that the grammar's first character does not exclude
#: already, in lower case (``$``- and ``_``-prefixed names cannot start a topic at all)
RESERVED_PREFIXES = ("amq.",)

# Topics that passed, so a topic seen before (most services publish to a few) costs one set
# lookup. Bounded: past the cap, new topics take the checks.
_GOOD: set[str] = set()
_GOOD_MAX = 4096


def topic_problem(topic: object) -> str | None:
    """What is wrong with ``topic`` (one line, naming the rule), or None when it is a topic."""
    if topic.__class__ is str and topic in _GOOD:
        return None
    if not isinstance(topic, str):
        return f"topic must be a str, got {type(topic).__name__}"
    if not topic:
        return "topic must not be empty"
    if len(topic) > MAX_TOPIC_BYTES:
        return f"topic is {len(topic)} characters, above the maximum of {MAX_TOPIC_BYTES}"
    if _TOPIC.fullmatch(topic) is None:
        return (
            f"topic {_shown(topic)} is not a name: use ASCII letters, digits, '.', '-', '_', "
            "'/', starting with a letter or digit (a topic is mapped to a broker destination "
            "by the relay's configuration, never used as a broker address such as '$SYS/...', "
            "'$JS.API...', '_INBOX...' or a URL)"
        )
    lowered = topic.lower()
    for prefix in RESERVED_PREFIXES:
        if lowered.startswith(prefix):
            return f"topic {_shown(topic)} starts with {prefix!r}, a prefix a broker reserves"
    if len(_GOOD) < _GOOD_MAX:
        _GOOD.add(topic)
    return None


def check_topic(topic: object) -> str:
    """``topic`` if it follows the grammar; else InvalidMessageError saying which rule fails."""
    if topic.__class__ is str and topic in _GOOD:
        return topic
    problem = topic_problem(topic)
    if problem is not None:
        raise InvalidMessageError(problem, field="topic")
    assert isinstance(topic, str)
    return topic


def _shown(topic: str) -> str:
    """The topic for an error line: repr (control characters escaped), cut to 80."""
    return repr(topic if len(topic) <= 80 else topic[:77] + "...")
