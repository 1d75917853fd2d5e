"""The per-key order guard (ordered=True) on a real PostgreSQL, with a hypothesis property."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inbox import OutOfOrderError, Verdict, record
from tests.inbox.inbox_helpers import apply_effect, effects, inbox_rows, make_envelope
from tests.support.flavours import Conn, Flavour
from tests.support.ledger import record as record_ledger

_EFFECT = "INSERT INTO effects (consumer, message_id, key, seq) VALUES (%s, %s, %s, %s)"


def _deliver(conn: psycopg.Connection[Any], consumer: str, msg: Any) -> Verdict:
    """One delivery in one transaction; the effect only for PROCESS; roll back when not acked."""
    verdict = record(conn, consumer=consumer, message=msg, ordered=True)
    if verdict is Verdict.PROCESS:
        apply_effect(conn, consumer, msg)
    conn.commit()
    return verdict


def _delivery(flavour: Flavour, conn: Conn) -> Any:
    """:func:`_deliver` in ``flavour`` on ``conn``."""

    def deliver(consumer: str, msg: Any) -> Verdict:
        verdict = flavour.record(conn, consumer=consumer, message=msg, ordered=True)
        if verdict is Verdict.PROCESS:
            conn.execute(_EFFECT, (consumer, msg.id, msg.key, msg.seq))
        conn.commit()
        return verdict

    return deliver


def test_order_guard_stale_gap_and_fill(flavour: Flavour, effects_url: str) -> None:
    m1, m2, m3 = (make_envelope(seq=s) for s in (1, 2, 3))
    conn = flavour.connect(effects_url)
    deliver = _delivery(flavour, conn)
    assert deliver("c", m1) is Verdict.PROCESS
    assert deliver("c", m3) is Verdict.OUT_OF_ORDER  # m2 missing: not now
    assert m3.id not in inbox_rows(effects_url, "c")  # no record, so it can come again
    assert deliver("c", m2) is Verdict.PROCESS
    assert deliver("c", m3) is Verdict.PROCESS  # redelivered after the gap filled
    # a different message claiming an already applied seq (e.g. republished) is stale
    assert deliver("c", make_envelope(seq=2)) is Verdict.STALE
    assert deliver("c", m2) is Verdict.DUPLICATE
    # other keys and other consumers have their own positions
    assert deliver("c", make_envelope(key="k2", seq=1)) is Verdict.PROCESS
    assert deliver("other", m1) is Verdict.PROCESS
    assert [row[3] for row in effects(effects_url, "c") if row[2] == "k1"] == [1, 2, 3]
    with psycopg.connect(effects_url) as conn:
        row = conn.execute(
            "SELECT last_seq FROM inbox_key_positions WHERE consumer = 'c' AND key = 'k1'"
        ).fetchone()
    assert row == (3,)


def test_receive_ordered_raises_out_of_order_and_returns_false_for_stale(
    flavour: Flavour, effects_url: str
) -> None:
    conn = flavour.connect(effects_url)
    with pytest.raises(OutOfOrderError, match="before its predecessor") as info:
        flavour.receive(conn, consumer="c", message=make_envelope(seq=2), ordered=True)
    assert info.value.retryable
    conn.rollback()
    assert flavour.receive(conn, consumer="c", message=make_envelope(seq=1), ordered=True)
    assert not flavour.receive(conn, consumer="c", message=make_envelope(seq=1), ordered=True)
    conn.commit()


# A schedule is a list of deliveries (message index per key); the broker then keeps
# redelivering what was not acknowledged, in publish order, until everything is settled.
_schedule = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 4)),  # (key, index of the message in that key)
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lengths=st.lists(st.integers(1, 5), min_size=3, max_size=3), schedule=_schedule)
def test_order_guard_property_equals_in_order_once_only(
    effects_url: str, lengths: list[int], schedule: list[tuple[int, int]]
) -> None:
    consumer = f"c{uuid.uuid4().hex[:8]}"  # each example its own consumer (same database)
    stream = {
        k: [make_envelope(key=f"k{k}", seq=s + 1) for s in range(n)] for k, n in enumerate(lengths)
    }
    acked: set[uuid.UUID] = set()
    with psycopg.connect(effects_url) as conn:
        for key, index in schedule:  # random redeliveries and reorderings
            if index < len(stream[key]):
                msg = stream[key][index]
                if _deliver(conn, consumer, msg) is not Verdict.OUT_OF_ORDER:
                    acked.add(msg.id)
        for msgs in stream.values():  # the broker redelivers everything not acknowledged
            for msg in msgs:
                if msg.id not in acked:
                    assert _deliver(conn, consumer, msg) is Verdict.PROCESS
    applied: dict[str, list[int]] = {}
    for _, _, key, seq in effects(effects_url, consumer):
        applied.setdefault(key, []).append(seq)
    expected = {f"k{k}": list(range(1, n + 1)) for k, n in enumerate(lengths)}
    assert applied == expected


def test_idempotency_key_republished_after_retention_moves_the_key_on(effects_url: str) -> None:
    """Retention deleted a published message; the producer publishes its idempotency key again
    and gets the same id under the key's next seq. The ordered consumer has applied that id:
    no second effect, but its seq moves the key on, in turn, so later messages are not stuck."""
    from outbox import publish

    with psycopg.connect(effects_url) as conn:
        first = publish(conn, topic="orders", key="k1", payload=1, idempotency_key="paid")
        conn.commit()
        assert record_ledger(effects_url) == 1  # numbered and recorded, as a relay does
        assert _deliver(conn, "c", make_envelope(id=first, seq=1)) is Verdict.PROCESS
        conn.execute("DELETE FROM outbox_messages WHERE id = %s", (first,))  # as retention does
        conn.commit()
        again = publish(conn, topic="orders", key="k1", payload=1, idempotency_key="paid")
        later = publish(conn, topic="orders", key="k1", payload=2)
        conn.commit()
        assert record_ledger(effects_url) == 2
        seqs = dict(conn.execute("SELECT id, seq FROM outbox_messages").fetchall())
        assert (again, seqs[again], seqs[later]) == (first, 2, 3)
        assert _deliver(conn, "c", make_envelope(id=later, seq=3)) is Verdict.OUT_OF_ORDER
        # In turn: no effect (applied as seq 1), but the key's position moves to 2.
        assert _deliver(conn, "c", make_envelope(id=again, seq=2)) is Verdict.DUPLICATE
        assert _deliver(conn, "c", make_envelope(id=later, seq=3)) is Verdict.PROCESS
        assert _deliver(conn, "c", make_envelope(id=again, seq=2)) is Verdict.DUPLICATE
    assert [row[3] for row in effects(effects_url, "c")] == [1, 3]


def test_a_known_id_ahead_of_its_turn_is_out_of_order_not_a_duplicate(
    flavour: Flavour, effects_url: str
) -> None:
    known = uuid.uuid4()
    conn = flavour.connect(effects_url)
    deliver = _delivery(flavour, conn)
    assert deliver("c", make_envelope(id=known, seq=1)) is Verdict.PROCESS
    # The same id re-created at seq 3 while seq 2 has not been applied: not its turn yet.
    assert deliver("c", make_envelope(id=known, seq=3)) is Verdict.OUT_OF_ORDER
    assert deliver("c", make_envelope(seq=2)) is Verdict.PROCESS
    assert deliver("c", make_envelope(id=known, seq=3)) is Verdict.DUPLICATE
    assert deliver("c", make_envelope(seq=4)) is Verdict.PROCESS
    again = make_envelope(id=known, seq=1)
    assert flavour.receive(conn, consumer="c", message=again, ordered=True) is False
    assert [row[3] for row in effects(effects_url, "c")] == [1, 2, 4]
