"""A producer chooses a topic, never a broker address: publish() (sync and async, one message
and a batch) and ``outbox_publish()`` refuse a topic outside the grammar of outbox/_topic.py
with one line and write nothing (real PostgreSQL). The relay's side, for a row inserted
directly: tests/relay/test_topic_boundary.py."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox import InvalidMessageError, Message
from outbox._topic import topic_problem
from tests.support.flavours import FLAVOURS, Flavour, flavour_of

#: the JetStream admin repro and its analogues on the other brokers
STEERING = [
    "$JS.API.STREAM.DELETE.VICTIM",  # NATS: deletes a stream with the relay's credentials
    "_INBOX.reply",  # NATS: another client's reply subject
    "__consumer_offsets",  # Kafka: the group offsets topic
    "__redis__:invalidate",  # Redis: a client-tracking channel (and a key outside the app)
    "$SYS/broker/clients/total",  # MQTT: the broker's system topics
    "$share/g/orders",  # MQTT: a shared subscription filter
    "https://sqs.us-east-1.amazonaws.com/123456789012/payments",  # SQS: another queue's URL
    "arn:aws:sns:us-east-1:123456789012:payments",  # SNS: another topic's ARN
    "amq.topic/orders",  # RabbitMQ: a reserved exchange
]


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """publish() and publish_async(), in turn."""
    with flavour_of(request.param) as chosen:
        yield chosen


def _count(url: str) -> int:
    """The messages written: in the ledger, where every writer puts them, and outbox_messages."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM outbox_wal_pending)"
            " + (SELECT count(*) FROM outbox_messages)"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("topic", STEERING)
def test_publish_refuses_a_broker_address_and_writes_nothing(
    flavour: Flavour, database_url: str, topic: str
) -> None:
    conn = flavour.connect(database_url)
    with pytest.raises(InvalidMessageError) as err:
        flavour.publish(conn, topic=topic, key="k", payload={})
    assert err.value.data["field"] == "topic"
    assert "\n" not in str(err.value)
    conn.commit()
    assert _count(database_url) == 0


@pytest.mark.parametrize("topic", STEERING[:3])
def test_publish_batch_refuses_the_whole_batch(database_url: str, topic: str) -> None:
    from outbox import publish_batch

    with psycopg.connect(database_url) as conn:
        with pytest.raises(InvalidMessageError, match="not a name"):
            publish_batch(conn, [Message("orders", "k", {}), Message(topic, "k", {})])
        conn.commit()
    assert _count(database_url) == 0


@pytest.mark.parametrize("topic", STEERING)
def test_outbox_publish_refuses_a_broker_address_and_writes_nothing(
    database_url: str, topic: str
) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            conn.execute("SELECT outbox_publish(%s, 'k', '{}')", (topic,))
        conn.rollback()
        assert "outbox_publish: topic" in str(err.value)
        # a name goes through, through the same function
        conn.execute("SELECT outbox_publish('orders.created', 'k', '{}')")
        conn.commit()
    assert _count(database_url) == 1


def test_the_sql_check_is_its_own_function(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT outbox_check_topic('billing/invoice-paid')")
        for topic in ("AMQ.x", "-x", "a b", "é"):
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                conn.execute("SELECT outbox_check_topic(%s)", (topic,))
            conn.rollback()


_TOPIC_CHARS = st.sampled_from([*"aZ09._-/$:@ *>#+é\x00\n", "amq.", "AMQ.", "_INBOX"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_TOPIC_CHARS, min_size=0, max_size=12))
def test_python_and_sql_agree_on_the_grammar(shared_url: str, parts: list[str]) -> None:
    topic = "".join(parts)
    if "\x00" in topic:  # PostgreSQL text holds no NUL: publish() refuses it before SQL
        assert topic_problem(topic) is not None
        return
    with psycopg.connect(shared_url, autocommit=True) as conn:
        try:
            conn.execute("SELECT outbox_check_topic(%s)", (topic,))
            sql_ok = True
        except psycopg.errors.InvalidParameterValue:
            sql_ok = False
    assert sql_ok == (topic_problem(topic) is None), topic
