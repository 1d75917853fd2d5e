"""handle_batch: many deliveries in one transaction, with every guarantee of handle()."""

from __future__ import annotations

import datetime as dt
import random
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, Outcome
from inbox.admin import blocked_keys
from outbox import ConfigurationError, InvalidMessageError
from tests.inbox.inbox_helpers import apply_effect, effects, inbox_rows, make_envelope
from tests.support.flavours import Flavour


def _apply(conn: Any, msg: Any) -> None:
    if msg.payload == b"poison":
        raise ValueError("cannot parse")
    apply_effect(conn, "c", msg)


def _transactions_of(url: str, ids: list[uuid.UUID]) -> int:
    """How many transactions wrote these inbox rows (distinct xmin)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT xmin::text) FROM inbox_messages WHERE message_id = ANY(%s)",
            (ids,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _poison(msg: Any) -> None:
    if msg.payload == b"poison":
        raise ValueError("cannot parse")


def test_unordered_batch_is_one_transaction_with_duplicates_filtered(
    flavour: Flavour, effects_url: str
) -> None:
    runner = flavour.runner(effects_url, fail=_poison)
    earlier = make_envelope(key="a")
    assert runner.handle(earlier).outcome is Outcome.PROCESSED
    batch = [make_envelope(key=f"k{i}") for i in range(5)]
    copy = batch[2]
    results = runner.handle_batch([*batch, earlier, copy])
    assert [r.outcome for r in results] == [Outcome.PROCESSED] * 5 + [Outcome.DUPLICATE] * 2
    assert [r.message_id for r in results] == [m.id for m in [*batch, earlier, copy]]
    assert sorted(e[1] for e in effects(effects_url, "c")) == sorted(
        m.id for m in [earlier, *batch]
    )  # one effect each: the copy in the batch and the earlier message are not applied again
    assert _transactions_of(effects_url, [m.id for m in batch]) == 1
    assert all(r.handler_seconds is not None for r in results[:5])
    # the whole batch again: every message a duplicate, nothing applied
    again = runner.handle_batch(batch)
    assert {r.outcome for r in again} == {Outcome.DUPLICATE}
    assert len(effects(effects_url, "c")) == 6
    assert inbox_rows(effects_url, "c")[batch[0].id][:2] == ("processed", 2)  # 2 deliveries


def test_ordered_batch_applies_each_key_in_seq_order(flavour: Flavour, effects_url: str) -> None:
    runner = flavour.runner(effects_url, fail=_poison, ordered=True)
    a = {n: make_envelope(key="a", seq=n) for n in range(1, 6)}
    b = {n: make_envelope(key="b", seq=n) for n in range(1, 3)}
    # a3 and a1 arrive swapped, a5 is ahead of a gap (a4 missing), b arrives in order
    batch = [a[3], b[1], a[1], a[2], b[2], a[5]]
    outcomes = [r.outcome for r in runner.handle_batch(batch)]
    assert outcomes == [Outcome.PROCESSED] * 5 + [Outcome.OUT_OF_ORDER]
    applied = [(e[2], e[3]) for e in effects(effects_url, "c")]
    assert [s for k, s in applied if k == "a"] == [1, 2, 3]
    assert [s for k, s in applied if k == "b"] == [1, 2]
    assert a[5].id not in inbox_rows(effects_url, "c")  # forgotten: redelivered later
    (waiting,) = blocked_keys(effects_url, consumer="c", min_age=dt.timedelta(0))
    assert (waiting.key, waiting.last_seq, waiting.waiting_seq) == ("a", 3, 5)
    # the gap fills; a stale message (a new id at an applied seq) is settled without effect
    stale = make_envelope(key="a", seq=2)
    outcomes = [r.outcome for r in runner.handle_batch([a[5], stale, a[4]])]
    assert outcomes == [Outcome.PROCESSED, Outcome.STALE, Outcome.PROCESSED]
    assert [e[3] for e in effects(effects_url, "c") if e[2] == "a"] == [1, 2, 3, 4, 5]
    assert inbox_rows(effects_url, "c")[stale.id][0] == "stale"
    assert blocked_keys(effects_url, consumer="c", min_age=dt.timedelta(0)) == []


def test_a_failing_message_is_isolated_and_the_rest_commits(
    flavour: Flavour, effects_url: str
) -> None:
    runner = flavour.runner(effects_url, fail=_poison, ordered=True, max_attempts=2)
    poison = make_envelope(key="a", seq=1, payload=b"poison")
    after = make_envelope(key="a", seq=2)
    others = [make_envelope(key=f"k{i}", seq=1) for i in range(3)]
    first = runner.handle_batch([others[0], poison, after, others[1], others[2]])
    assert [r.outcome for r in first] == [
        Outcome.PROCESSED, Outcome.FAILED, Outcome.OUT_OF_ORDER, Outcome.PROCESSED,
        Outcome.PROCESSED,
    ]  # fmt: skip
    assert (first[1].attempts, str(first[1].error)) == (1, "cannot parse")
    assert first[1].handler_seconds is not None
    # redelivered: the poison message dies on its second attempt, the key moves on past it
    second = runner.handle_batch([poison, after])
    assert [r.outcome for r in second] == [Outcome.DEAD, Outcome.PROCESSED]
    assert inbox_rows(effects_url, "c")[poison.id][:2] == ("dead", 2)
    assert sorted((e[2], e[3]) for e in effects(effects_url, "c")) == [
        ("a", 2), ("k0", 1), ("k1", 1), ("k2", 1),
    ]  # fmt: skip


def test_hold_parks_a_batch_behind_its_dead_message(flavour: Flavour, effects_url: str) -> None:
    runner = flavour.runner(effects_url, fail=_poison, ordered=True, max_attempts=1, on_dead="hold")
    poison = make_envelope(key="a", seq=1, payload=b"poison")
    later = [make_envelope(key="a", seq=n) for n in (2, 3)]
    results = runner.handle_batch([poison, *later])
    # the poison message dies and holds its key; the batch without it parks the later ones
    assert [r.outcome for r in results] == [Outcome.DEAD, Outcome.PARKED, Outcome.PARKED]
    results = runner.handle_batch(later)  # redelivered: kept already, applied from the hold
    assert [r.outcome for r in results] == [Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert {inbox_rows(effects_url, "c")[m.id][0] for m in later} == {"parked"}
    assert effects(effects_url, "c") == []


def test_batch_handler_gets_only_the_messages_to_apply(
    pool: ConnectionPool, effects_url: str
) -> None:
    seen: list[list[uuid.UUID]] = []

    def batch_handler(conn: Any, messages: list[Any]) -> None:
        seen.append([m.id for m in messages])
        for m in messages:
            _apply(conn, m)

    runner = HandlerRunner(pool, batch_handler=batch_handler, consumer="c", max_attempts=1)
    done = make_envelope(key="x")
    runner.handle_batch([done])
    batch = [make_envelope(key=f"k{i}") for i in range(3)]
    runner.handle_batch([batch[0], done, batch[1], batch[2]])
    assert seen[-1] == [m.id for m in batch]
    # a batch handler that raises: one transaction per message finds the culprit
    poison = make_envelope(key="p", payload=b"poison")
    fresh = make_envelope(key="q")
    outcomes = [r.outcome for r in runner.handle_batch([poison, fresh])]
    assert outcomes == [Outcome.DEAD, Outcome.PROCESSED]
    assert fresh.id in {e[1] for e in effects(effects_url, "c")}


def test_handler_and_batch_handler_are_exclusive(pool: ConnectionPool) -> None:
    with pytest.raises(ConfigurationError, match="exactly one of handler"):
        HandlerRunner(pool, _apply, batch_handler=lambda c, ms: None, consumer="c")
    with pytest.raises(ConfigurationError, match="exactly one of handler"):
        HandlerRunner(pool, consumer="c")


def test_an_invalid_message_fails_the_call_before_anything_is_written(
    pool: ConnectionPool, effects_url: str
) -> None:
    runner = HandlerRunner(pool, _apply, consumer="c", ordered=True)
    with pytest.raises(InvalidMessageError, match="has no seq"):
        runner.handle_batch([make_envelope(), make_envelope(seq=None)])
    assert inbox_rows(effects_url, "c") == {}


def test_also_commits_with_the_batch_and_sees_the_acks(
    pool: ConnectionPool, effects_url: str
) -> None:
    calls: list[list[bool]] = []

    def also(conn: Any, acks: list[bool]) -> None:
        calls.append(acks)
        conn.execute("INSERT INTO effects (consumer, message_id, key) VALUES ('also', %s, 'x')",
                     (uuid.uuid4(),))  # fmt: skip

    runner = HandlerRunner(pool, _apply, consumer="c", ordered=True, max_attempts=3)
    batch = [make_envelope(key="a", seq=1), make_envelope(key="b", seq=2),
             make_envelope(key="c", seq=1, payload=b"poison")]  # fmt: skip
    runner.handle_batch(batch, also=also)
    assert calls == [[True, False, False]]  # b waits for seq 1, c failed
    assert len(effects(effects_url, "also")) == 1


def test_a_message_dead_at_once_moves_its_key_on_within_the_batch(
    flavour: Flavour, effects_url: str
) -> None:
    runner = flavour.runner(effects_url, fail=_poison, ordered=True, max_attempts=1)
    batch = [make_envelope(key="a", seq=2), make_envelope(key="a", seq=1),
             make_envelope(key="b", seq=1, payload=b"poison"),
             make_envelope(key="b", seq=2)]  # fmt: skip
    outcomes = [r.outcome for r in runner.handle_batch(batch)]
    # b1 dies at its first attempt and the key moves on: b2 applies in the retried batch
    assert outcomes == [Outcome.PROCESSED, Outcome.PROCESSED, Outcome.DEAD, Outcome.PROCESSED]
    assert [(e[2], e[3]) for e in effects(effects_url, "c")] == [("a", 1), ("a", 2), ("b", 2)]


def test_concurrent_overlapping_batches_apply_each_message_once_in_order(
    effects_url: str,
) -> None:
    """Four threads deliver overlapping, shuffled batches of one stream (a broker redelivering
    to several consumer instances) until every message is settled: each message's effect is
    applied exactly once, each key's effects in seq order, and nothing deadlocks."""
    keys = [f"k{i}" for i in range(6)]
    stream = [make_envelope(key=k, seq=n) for k in keys for n in range(1, 16)]
    settled: set[uuid.UUID] = set()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with ConnectionPool(effects_url, min_size=1, max_size=1) as pool:
            runner = HandlerRunner(pool, _apply, consumer="c", ordered=True)
            for _ in range(400):
                with lock:
                    open_ = [m for m in stream if m.id not in settled]
                if not open_:
                    return
                batch = rng.sample(open_, min(len(open_), rng.randint(1, 12)))
                try:
                    results = runner.handle_batch(batch)
                except BaseException as exc:  # reported below: a batch must never raise
                    errors.append(exc)
                    return
                with lock:
                    settled.update(r.message_id for r in results if r.outcome.ack)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert settled == {m.id for m in stream}
    applied = effects(effects_url, "c")
    assert sorted(e[1] for e in applied) == sorted(m.id for m in stream)
    for k in keys:
        assert [e[3] for e in applied if e[2] == k] == list(range(1, 16))
