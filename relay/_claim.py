"""Claim, decide, mark: the relay's three steps around a broker call, without the loop.

Each database function runs one statement from :mod:`relay._statements` on an autocommit
connection. :func:`decide` is pure: it turns a claim and the broker's results into the outcome
of every row, keeping each key's order.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import psycopg
from psycopg.types.json import set_json_loads

from outbox.envelope import Envelope
from outbox.kit import redact
from relay._config import RelayConfig
from relay._statements import RelayStatements, relay_statements
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationUnavailableError,
    NotSentError,
    PermanentPublishError,
)

__all__ = [
    "Claim",
    "Outcome",
    "backoff_delay",
    "claim_batch",
    "decide",
    "mark_batch",
    "resume_point",
]

Action = Literal["published", "retry", "dead", "release"]


@dataclass(frozen=True)
class Claim:
    """Rows leased by one claim, sorted by (topic, key, seq), and the claim's fencing token."""

    token: uuid.UUID
    envelopes: list[Envelope]
    attempts: list[int]
    #: local monotonic time after which the lease may have lapsed (publishing must stop)
    deadline: float


@dataclass(frozen=True)
class Outcome:
    id: uuid.UUID
    action: Action
    delay: float = 0.0
    error: str | None = None


def _claimed(row: tuple[Any, ...]) -> tuple[Envelope, int]:
    """A claimed row (outbox_claim_batch's RETURNING): its envelope and its attempts."""
    id_, topic, key, seq, payload, content_type, headers, traceparent, created_at, attempts = row
    if isinstance(headers, str):  # pragma: no cover - jsonb arrives decoded with psycopg 3
        headers = json.loads(headers)
    envelope = Envelope(
        id=id_,
        topic=topic,
        key=key,
        seq=seq,
        payload=bytes(payload),
        content_type=content_type,
        headers=headers or {},
        traceparent=traceparent,
        created_at=created_at,
    )
    return envelope, attempts


async def claim_batch(
    conn: psycopg.AsyncConnection[Any],
    stmts: RelayStatements,
    config: RelayConfig,
    after: tuple[str, str] = ("", ""),
    paused: Sequence[str] = (),
) -> Claim | None:
    """Lease the next batch (see outbox_claim_batch), or None when nothing is claimable.

    Keys are visited in (topic, key) order starting after ``after``, wrapping around once.
    Topics in ``paused`` (their destination refuses messages for now) are not claimed.
    """
    claim = await _claim_from(conn, stmts, config, after, paused)
    if claim is None and after != ("", ""):
        claim = await _claim_from(conn, stmts, config, ("", ""), paused)
    return claim


def resume_point(claim: Claim | None, config: RelayConfig) -> tuple[str, str]:
    """Where the next claim starts its walk over keys.

    After the last key of a full batch: the keys behind it may not have had their turn. After
    a batch that was not full, from the first key: that claim walked every key from its start
    to the last one, and the keys before its start come next; starting after its last key
    would find nothing at a steady trickle and need a second statement that wraps around.
    """
    if claim is None or len(claim.envelopes) < config.batch_size:
        return ("", "")
    last = claim.envelopes[-1]
    return (last.topic, last.key)


async def _claim_from(
    conn: psycopg.AsyncConnection[Any],
    stmts: RelayStatements,
    config: RelayConfig,
    after: tuple[str, str],
    paused: Sequence[str],
) -> Claim | None:
    token = uuid.uuid4()
    started = time.monotonic()
    params = {
        "after_topic": after[0],
        "after_key": after[1],
        "limit": config.batch_size,
        "per_key": config.per_key_batch,
        "owner": config.relay_id,
        "token": token,
        "lease_seconds": config.lease_seconds,
        "paused": list(paused),
        **config.dead_policy_params(),
    }
    cur = await conn.execute(stmts.claim, params)
    rows = await cur.fetchall()
    if not rows:
        return None
    claimed = sorted(map(_claimed, rows), key=_in_key_order)
    # The server's lease started no earlier than `started`; stop publishing a little before it
    # can lapse, so a slow clock or a pause cannot make two relays publish one key at once.
    deadline = started + config.lease_seconds * 0.9
    return Claim(token, [e for e, _ in claimed], [a for _, a in claimed], deadline)


def _in_key_order(claimed: tuple[Envelope, int]) -> tuple[str, str, int | None]:
    envelope = claimed[0]
    return envelope.topic, envelope.key, envelope.seq


async def mark_batch(
    conn: psycopg.AsyncConnection[Any],
    stmts: RelayStatements,
    token: uuid.UUID,
    outcomes: Sequence[Outcome],
    *,
    durable: bool = False,
) -> set[uuid.UUID]:
    """Apply outcomes under the claim's fencing token; return the ids actually marked.

    The relay's sessions run with ``synchronous_commit = off`` (see ``relay_session``): losing
    the last few hundred milliseconds of marks in a PostgreSQL crash only means publishing
    those messages again, which at-least-once allows. ``durable`` marks (at-most-once: marked
    *before* sending) must survive a crash, so they wait for the flush.
    """
    if not outcomes:
        return set()
    params: dict[str, Any] = {"ids": [o.id for o in outcomes], "token": token}
    if all(o.action == "published" for o in outcomes):
        stmt = stmts.mark_published  # the common mark: no per-row outcome to join
    else:
        stmt = stmts.mark
        params["actions"] = [o.action for o in outcomes]
        params["delays"] = [o.delay for o in outcomes]
        params["errors"] = [o.error for o in outcomes]
    if not durable:
        cur = await conn.execute(stmt, params)
        return {r[0] for r in await cur.fetchall()}
    async with conn.transaction():
        await conn.execute(stmts.durable_commit)
        cur = await conn.execute(stmt, params)
        return {r[0] for r in await cur.fetchall()}


async def relay_session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Configure a relay pool connection: claims and at-least-once marks need no flush wait.

    A claim or mark lost in a database crash is harmless: the lease was never recorded (any
    relay claims the row again) or the row is still pending (it is published again, and the
    broker's dedup and the consumer's inbox absorb the repeat). Per-key order holds: a lost
    mark of message n means n is published again before n+1 can be re-claimed.
    """
    await conn.execute(relay_statements(None).session)
    # The claim returns every row's headers as jsonb: orjson decodes them with less work than
    # the standard library's json (the driver's default), on the relay's hot path.
    set_json_loads(orjson.loads, conn)


def backoff_delay(attempts: int, config: RelayConfig, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: base * 2**(attempts-1), capped, times U(0.5, 1)."""
    raw = config.backoff_base * (2 ** min(max(attempts - 1, 0), 30))
    jitter: float = (rng or random).uniform(0.5, 1.0)
    return float(min(config.backoff_max, raw) * jitter)


def _describe(exc: BaseException) -> str:
    """The error stored in ``last_error``: masked before it is stored (a broker's error may
    quote a URL with its password), so every reader of the row (``outbox dead list``, the
    console, ``outbox trace``) sees it masked."""
    return redact(f"{type(exc).__name__}: {exc}")[:2000]


def decide(
    claim: Claim,
    results: Sequence[BaseException | None],
    config: RelayConfig,
    rng: random.Random | None = None,
) -> list[Outcome]:
    """The outcome of each row, keeping per-key order.

    Per key, in seq order: acknowledged rows are published until the first failure. A failure
    is retried later (or dead after max attempts, at once if permanent). Rows of the same key
    after a retried row, or after a dead row under 'hold', are released untried-as-far-as-we-
    count: they go out again after the failed one, never before it. A row the adapter did not
    send (NotSentError), whose ack was lost with the connection (BrokerUnreachableError) or
    whose destination refuses messages for now (DestinationUnavailableError: a configuration
    to fix, its topic is paused) is released too, with the rest of its key: it had no attempt
    to count, so under 'skip' it cannot be dead-lettered without ever being sent.
    """
    outcomes: list[Outcome] = []
    blocked: tuple[str, str] | None = None
    for env, attempts, result in zip(claim.envelopes, claim.attempts, results, strict=True):
        key = (env.topic, env.key)
        policy = config.policy(env.topic)
        if blocked == key:
            outcomes.append(Outcome(env.id, "release"))
            continue
        if result is None:
            outcomes.append(Outcome(env.id, "published"))
            continue
        untried = NotSentError | BrokerUnreachableError | DestinationUnavailableError
        if isinstance(result, untried):
            outcomes.append(Outcome(env.id, "release"))
            blocked = key
            continue
        error = _describe(result)
        if isinstance(result, PermanentPublishError) or attempts >= policy.max_attempts:
            outcomes.append(Outcome(env.id, "dead", error=error))
            if policy.on_dead == "hold":
                blocked = key
        else:
            outcomes.append(Outcome(env.id, "retry", backoff_delay(attempts, config, rng), error))
            blocked = key
    return outcomes
