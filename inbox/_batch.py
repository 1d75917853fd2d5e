"""The inbox's decisions for a whole batch of messages, in one transaction.

:func:`batch_steps` takes the same decisions as the single-message steps of ``_receive`` (a
duplicate, the order guard, a parked message), for N messages with one statement per step:
record them all, note the duplicates, lock the batch's keys, then advance, mark stale and
forget in bulk. Within a key the batch is decided in seq order, so a batch that holds seq 3
before seq 2 applies both, in order. The generator yields ``(statement, params)`` and is sent
every row the statement returned (``run_steps(..., all_rows=True)``).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from inbox._receive import MessageRef, Verdict, held_params
from inbox._statements import InboxStatements

__all__ = ["BatchSteps", "Plan", "batch_steps"]

Rows = list[dict[str, Any]]
BatchSteps = Generator[tuple[bytes, dict[str, Any]], Rows, "Plan"]


@dataclass
class Plan:
    """Per index of the batch, its verdict; copies of one id in a batch share its first
    occurrence's verdict (a processed original makes its copies duplicates)."""

    verdicts: list[Verdict]


def _unique(refs: Sequence[MessageRef]) -> tuple[list[int], dict[int, int]]:
    """Indexes of first occurrences, and each later copy's original index."""
    first: dict[uuid.UUID, int] = {}
    copies: dict[int, int] = {}
    for i, ref in enumerate(refs):
        if ref.id in first:
            copies[i] = first[ref.id]
        else:
            first[ref.id] = i
    return list(first.values()), copies


def batch_steps(
    stmts: InboxStatements,
    consumer: str,
    refs: Sequence[MessageRef],
    messages: Sequence[Any],
    ordered: bool,
) -> BatchSteps:
    """Record ``refs`` for ``consumer`` and decide each; returns the :class:`Plan`."""
    unique, copies = _unique(refs)
    base = {"consumer": consumer}
    recorded = yield (
        stmts.record_batch,
        base
        | {
            "ids": [refs[i].id for i in unique],
            "topics": [refs[i].topic for i in unique],
            "keys": [refs[i].key for i in unique],
            "seqs": [refs[i].seq for i in unique],
        },
    )
    fresh = {row["message_id"] for row in recorded}
    verdicts: dict[int, Verdict] = {}
    known = [i for i in unique if refs[i].id not in fresh]
    parked: set[uuid.UUID] = set()
    if known:
        noted = yield stmts.note_duplicates, base | {"ids": [refs[i].id for i in known]}
        parked = {row["message_id"] for row in noted if row["status"] == "parked"}
    decide_later = []
    for i in unique:
        if refs[i].id in fresh:
            if ordered:
                decide_later.append(i)
            else:
                verdicts[i] = Verdict.PROCESS
        elif not ordered or refs[i].id in parked:
            verdicts[i] = Verdict.DUPLICATE
        else:
            decide_later.append(i)
    if decide_later:
        yield from _ordered(stmts, base, refs, messages, decide_later, fresh, verdicts)
    return Plan(
        [_copy(verdicts[copies[i]]) if i in copies else verdicts[i] for i in range(len(refs))]
    )


def _copy(original: Verdict) -> Verdict:
    """A second copy of one id in a batch: applied (or kept) once, through its original."""
    return Verdict.DUPLICATE if original in (Verdict.PROCESS, Verdict.PARKED) else original


def _key_columns(keys: Sequence[tuple[str, str, str]]) -> dict[str, list[str]]:
    """(origin, topic, key) triples as the three arrays the position statements take."""
    return {
        "origins": [k[0] for k in keys],
        "topics": [k[1] for k in keys],
        "keys": [k[2] for k in keys],
    }


def _ordered(
    stmts: InboxStatements,
    base: dict[str, Any],
    refs: Sequence[MessageRef],
    messages: Sequence[Any],
    indexes: list[int],
    fresh: set[uuid.UUID],
    verdicts: dict[int, Verdict],
) -> Generator[tuple[bytes, dict[str, Any]], Rows, None]:
    """The order guard for the batch: lock every key once, walk each key's messages in seq
    order from its position, then write what moved in one statement per kind."""
    by_key: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i in indexes:
        by_key[(refs[i].origin, refs[i].topic, refs[i].key)].append(i)
    keys = sorted(by_key)
    rows = yield stmts.positions_lock, base | _key_columns(keys)
    positions = {
        (row["origin"], row["topic"], row["key"]): (int(row["last_seq"]), row["held_seq"])
        for row in rows
    }
    advanced: dict[tuple[str, str, str], int] = {}
    stale: list[uuid.UUID] = []
    refused: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for key in keys:
        last, held = positions[key]
        for i in sorted(by_key[key], key=lambda j: refs[j].seq or 0):
            seq = refs[i].seq
            assert seq is not None  # as_ref(ordered=True) made sure
            is_fresh = refs[i].id in fresh
            if held is not None and seq >= int(held):
                verdicts[i] = Verdict.PARKED if is_fresh else Verdict.DUPLICATE
            elif seq <= last:
                verdicts[i] = Verdict.STALE if is_fresh else Verdict.DUPLICATE
                if is_fresh:
                    stale.append(refs[i].id)
            elif seq == last + 1:
                # a known id at the next seq was re-created by the producer after outbox
                # retention: applied already, but its seq still moves the key on
                verdicts[i] = Verdict.PROCESS if is_fresh else Verdict.DUPLICATE
                last = advanced[key] = seq
            else:
                verdicts[i] = Verdict.OUT_OF_ORDER
                if is_fresh:
                    refused[key].append(i)
    if advanced:
        moved = sorted(advanced)
        yield (
            stmts.positions_advance,
            base | _key_columns(moved) | {"seqs": [advanced[k] for k in moved]},
        )
    if stale:
        yield stmts.mark_stale_batch, base | {"ids": stale}
    if refused:
        waiting = sorted(refused)
        yield (
            stmts.forget_batch,
            base
            | _key_columns(waiting)
            | {
                "seqs": [min(refs[i].seq or 0 for i in refused[k]) for k in waiting],
                "refused": [len(refused[k]) for k in waiting],
                "ids": [refs[i].id for k in waiting for i in refused[k]],
            },
        )
    for i in indexes:
        if verdicts[i] is Verdict.PARKED:
            yield stmts.park, held_params(refs[i], messages[i])
