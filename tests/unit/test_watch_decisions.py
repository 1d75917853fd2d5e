"""The commit watch's decisions (relay/_watch.py), on simulated histories.

A history is a set of transactions (each gets an id, may bump the write counter, then ends) and
a series of readings, each as the watch's one statement takes it: the snapshot as the statement
starts, then the counter and the next transaction id a moment later (events may fall between).
A snapshot is PostgreSQL's: ``xmax`` is one past the latest ended id, and only ids below it are
listed as running. The watch must wake at the first reading whose snapshot comes after a
writer's commit, for every writer, whatever the interleaving. Without any bump it wakes only at
its first reading, and when a transaction that was not over then ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay._watch import Snapshot, WatchState, next_xid

BASE = 100  # ids below BASE ended before the history starts


@dataclass(frozen=True)
class Txn:
    assigned: float  # gets its id
    bumped: float | None  # takes a number from the counter (writers only)
    ended: float


Reading = tuple[float, float]  # (snapshot taken, counter and next id read)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Txn], list[Reading]]:
    txns = []
    for _ in range(draw(st.integers(1, 8))):
        a = draw(st.integers(0, 400))
        writer = draw(st.booleans())
        b = a + draw(st.integers(1, 60)) if writer else None
        e = (b if b is not None else a) + draw(st.integers(1, 120))
        txns.append(Txn(a + 0.1, None if b is None else b + 0.2, e + 0.3))
    readings = []
    t = 0.05
    while t < 700:
        d = draw(st.sampled_from([0.01, 0.5, 3.0]))
        readings.append((t, t + d))
        t += d + draw(st.integers(1, 25))
    return txns, readings


def replay(txns: list[Txn], readings: list[Reading]) -> list[bool]:
    order = sorted(txns, key=lambda x: x.assigned)
    xid = {id(x): BASE + i for i, x in enumerate(order)}
    watch = WatchState()
    wakes = []
    for s, r in readings:
        done = [xid[id(x)] for x in order if x.ended < s]
        xmax = max(done, default=BASE - 1) + 1
        running = frozenset(
            xid[id(x)] for x in order if x.assigned < s and x.ended > s and xid[id(x)] < xmax
        )
        counter = sum(1 for x in txns if x.bumped is not None and x.bumped < r)
        nxt = BASE + sum(1 for x in order if x.assigned < r)
        wake, _ = watch.observe(counter, Snapshot(xmax, running), nxt)
        wakes.append(wake)
    return wakes


@settings(max_examples=500, deadline=None)
@given(histories())
def test_every_writer_wakes_the_first_reading_after_its_commit(
    history: tuple[list[Txn], list[Reading]],
) -> None:
    txns, readings = history
    wakes = replay(txns, readings)
    for x in txns:
        if x.bumped is None:
            continue
        first_after = next((k for k, (s, _) in enumerate(readings) if s > x.ended), None)
        if first_after is not None:
            assert wakes[first_after], (x, first_after, readings[first_after])


@settings(max_examples=200, deadline=None)
@given(histories())
def test_without_writers_it_wakes_only_for_what_was_unknown(
    history: tuple[list[Txn], list[Reading]],
) -> None:
    txns, readings = history
    readers = [Txn(x.assigned, None, x.ended) for x in txns]
    wakes = replay(readers, readings)
    assert wakes[0] is True
    s0, r0 = readings[0]
    unknown = [x for x in readers if x.assigned < r0 and x.ended > s0]
    for k in range(1, len(readings)):
        if wakes[k]:
            since, now = readings[k - 1][0], readings[k][0]
            assert any(since < x.ended < now for x in unknown), (k, readings[k])


def test_a_writer_that_stays_open_is_watched_until_it_ends() -> None:
    watch = WatchState()
    assert watch.observe(0, Snapshot(10, frozenset()), 10) == (True, True)  # first reading
    assert watch.observe(0, Snapshot(10, frozenset()), 10) == (False, False)
    # xid 10 publishes and stays open: nothing ended, it is a candidate above xmax
    assert watch.observe(1, Snapshot(10, frozenset()), 11) == (False, True)
    assert watch.candidates == (frozenset(), (10, 11))
    assert watch.observe(1, Snapshot(10, frozenset()), 11) == (False, False)
    # xid 11, no writer, comes and goes: xmax passes 10 while it runs, listed from now on
    assert watch.observe(1, Snapshot(12, frozenset({10})), 12) == (False, False)
    assert watch.candidates == (frozenset({10}), (0, 0))
    # it commits: the next reading wakes, and nothing is watched any more
    assert watch.observe(1, Snapshot(12, frozenset()), 12) == (True, True)
    assert watch.candidates == (frozenset(), (0, 0))
    assert watch.observe(1, Snapshot(13, frozenset()), 13) == (False, False)


def test_a_writer_that_ends_between_snapshot_and_counter_read_is_caught_next() -> None:
    watch = WatchState()
    watch.observe(5, Snapshot(20, frozenset()), 20)
    # xid 20 got its id, bumped and committed after the snapshot, before the counter read
    assert watch.observe(6, Snapshot(20, frozenset()), 21) == (False, True)
    assert watch.observe(6, Snapshot(21, frozenset()), 21) == (True, True)


def test_the_next_id_is_widened_with_the_snapshot_epoch() -> None:
    epoch = 7 << 32
    assert next_xid(epoch + 100, 105) == epoch + 105
    assert next_xid(epoch + 2**32 - 2, 3 + 4) == epoch + 2**32 + 7  # the counter wrapped
    assert next_xid(epoch + 100, 105 - 2**32) == epoch + 105  # age() is signed


@pytest.mark.parametrize(
    ("text", "xmax", "running"),
    [
        ("100:100:", 100, set()),
        ("98:105:98,101", 105, {98, 101}),
        ("4294967296:4294967300:4294967297", 4294967300, {4294967297}),
    ],
)
def test_snapshot_text_is_parsed(text: str, xmax: int, running: set[int]) -> None:
    assert Snapshot.parse(text) == Snapshot(xmax, frozenset(running))


@pytest.mark.parametrize("text", ["", "1:2", "a:b:c", "1:2:3:4"])
def test_a_malformed_snapshot_says_what_it_got(text: str) -> None:
    with pytest.raises(ValueError, match="not a pg_snapshot"):
        Snapshot.parse(text)
