"""``outbox replay``: re-publish a topic's retained history to one late consumer.

What is retained is what the outbox still holds: published rows are deleted by retention
(``retention_seconds``, ``outbox retention``), so a replay reaches back as far as that, and no
further (docs/how-to/onboard-a-consumer.md says how to bootstrap a consumer whose history is
older). Rows go out in (key, seq) order, with their ids, sequence numbers, headers and payload
as the relay sent them, to a destination only that consumer reads: its inbox applies each
once, drops a repeat, and applies a key's messages in order.

Safe to interrupt: after the broker confirms a batch, one transaction moves the cursor of the
(topic, consumer) past it (``outbox_replay_cursors``) and audits every message of it
(``outbox_dead_audit``, action ``replay``, like a re-drive). A re-run continues after the
cursor; what was in flight when it stopped goes again, which the inbox drops (same ids). One
replay per (topic, consumer) at a time (an advisory lock).

The rows are read through a server-side cursor in a read-only transaction that is closed and
re-opened from the persisted position every ``chunk_seconds``, so a long replay (it is rate
bounded) never holds one snapshot for long: an old snapshot keeps VACUUM from the outbox's
dead rows, which every publish makes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import getpass
import hashlib
import json
import socket
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox.envelope import HEADER_REPLAY, Envelope
from outbox.exceptions import ConfigurationError
from outbox.kit import redact
from relay._origin import read_origin, stamped
from relay._replay_statements import ReplayStatements, replay_statements
from relay._statements import relay_statements
from relay.brokers.base import Publisher
from relay.exceptions import PermanentPublishError, ReplayError

__all__ = [
    "DEFAULT_DESTINATION",
    "ReplayError",
    "ReplayProgress",
    "ReplayResult",
    "replay",
]

#: where a replay goes unless told: a destination of its own per consumer and topic
DEFAULT_DESTINATION = "replay.{consumer}.{topic}"

#: consecutive failed attempts of one batch before the replay stops (and can be re-run)
MAX_BATCH_ATTEMPTS = 5


@dataclass(frozen=True)
class ReplayProgress:
    """Where a replay stands (after each confirmed batch)."""

    topic: str
    consumer: str
    destination: str
    #: sent and confirmed by this run, and what this run had to send when it started
    sent: int
    total: int
    #: confirmed over every run of this (topic, consumer)
    replayed: int
    last_key: str | None
    last_seq: int | None
    elapsed: float

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed if self.elapsed > 0 else 0.0


@dataclass(frozen=True)
class ReplayResult:
    topic: str
    consumer: str
    destination: str
    #: sent by this run; over every run
    sent: int
    replayed: int
    #: this run continued a cursor an earlier run left
    resumed: bool


def default_actor() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _envelope(row: dict[str, Any], token: str) -> Envelope:
    headers = row["headers"]
    if isinstance(headers, str):  # pragma: no cover - jsonb arrives decoded with psycopg 3
        headers = json.loads(headers)
    return Envelope(
        id=row["id"], topic=row["topic"], key=row["key"], seq=row["seq"],
        payload=bytes(row["payload"]), content_type=row["content_type"],
        headers={**(headers or {}), HEADER_REPLAY: token},
        traceparent=row["traceparent"], created_at=row["created_at"],
    )  # fmt: skip


def replay_token(consumer: str, started_at: dt.datetime) -> str:
    """The replay's part of the broker's dedup id (``outbox.envelope.HEADER_REPLAY``): one per
    replay cursor, the same when a run continues it (the broker drops what a resumed run sends
    again), another after ``--restart``. Without it, JetStream (or an SQS FIFO queue) would
    drop every replayed message as a duplicate of its original inside its window, and the
    replay would report messages the broker never kept."""
    digest = hashlib.sha256(f"{consumer}\0{started_at.isoformat()}".encode()).hexdigest()
    return f"replay-{digest[:12]}"


def resolve_destination(template: str, *, topic: str, consumer: str) -> str:
    """``template`` with ``{topic}`` and ``{consumer}`` filled (a plain name stays as it is)."""
    refused = ConfigurationError(
        f"--destination {template!r}: only {{topic}} and {{consumer}} may be filled in "
        "(no attribute, index, conversion or format spec)"
    )
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError:  # an unmatched brace
        raise refused from None
    if any(name not in ("topic", "consumer") or spec or conv for name, spec, conv in fields):
        raise refused
    dest = template.format(topic=topic, consumer=consumer)
    if not dest:
        raise ConfigurationError("--destination is empty")
    return dest


async def replay(
    database_url: str,
    broker: str | Publisher,
    *,
    topic: str,
    consumer: str,
    destination: str = DEFAULT_DESTINATION,
    since: dt.datetime | None = None,
    rate: float | None = None,
    batch: int = 500,
    restart: bool = False,
    actor: str | None = None,
    reason: str | None = None,
    schema: str | None = None,
    broker_options: dict[str, Any] | None = None,
    on_progress: Callable[[ReplayProgress], None] | None = None,
    chunk_seconds: float = 30.0,
) -> ReplayResult:
    """Re-publish ``topic``'s retained, published messages to ``destination`` (default
    ``replay.{consumer}.{topic}``), for ``consumer`` alone, in (key, seq) order, at most
    ``rate`` messages a second.

    ``broker``: a broker URL (the adapter is built mapping the topic to the destination, with
    ``broker_options``), or a started-or-not :class:`Publisher` that already sends the topic
    there. ``since``: only messages committed at or after it (a first run's choice; a re-run
    keeps the cursor's, unless ``restart``). ``restart``: forget the cursor, start over.
    Raises :class:`ReplayError` when the broker keeps refusing (the cursor keeps what it
    confirmed), ConfigurationError for a bad argument or a replay of the same (topic,
    consumer) already running.
    """
    for name, value in (("topic", topic), ("consumer", consumer)):
        if not value or not value.strip():
            raise ConfigurationError(f"replay needs a {name}")
    if rate is not None and rate <= 0:
        raise ConfigurationError(f"--rate must be > 0 messages a second, got {rate}")
    if batch < 1:
        raise ConfigurationError(f"--batch must be >= 1, got {batch}")
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=dt.UTC)
    dest = resolve_destination(destination, topic=topic, consumer=consumer)
    if rate is not None:
        batch = max(1, min(batch, int(rate)))
    actor = actor or default_actor()
    stmts = replay_statements(schema)
    key = {"topic": topic, "consumer": consumer}
    async with await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as conn:
        row = await (await conn.execute(stmts.lock, key)).fetchone()
        if not row or not row["locked"]:
            raise ConfigurationError(
                f"a replay of topic {topic!r} to {consumer!r} is already running (one at a "
                "time: the other one holds the lock until it ends)"
            )
        cursor = await _open_cursor(
            conn, stmts, key, dest=dest, since=since, restart=restart, actor=actor,
            reason=reason, options={"rate": rate, "batch": batch},
        )  # fmt: skip
        resumed, since, last_key, last_seq, replayed, started_at = cursor
        total = await _remaining(conn, stmts, topic, since, last_key, last_seq)
        # the origin the relay puts on the messages (relay/_origin.py): replayed copies carry
        # it too, or a consumer would take them for another database's
        origin = await read_origin(conn, relay_statements(schema).origin)
        publisher = _publisher(broker, topic, dest, broker_options)
        await publisher.start()
        try:
            run = _Run(conn, stmts, publisher, key, dest, actor, reason, on_progress)
            run.origin = origin
            run.token = replay_token(consumer, started_at)
            run.replayed, run.last_key, run.last_seq, run.total = (
                replayed, last_key, last_seq, total,
            )  # fmt: skip
            await run.go(database_url, since, batch, rate, chunk_seconds)
            row = await (await conn.execute(stmts.finish, key)).fetchone()
            await conn.commit()
        finally:
            await publisher.close()
    replayed_total = int(row["replayed"]) if row else 0
    return ReplayResult(topic, consumer, dest, run.sent, replayed_total, resumed)


async def _open_cursor(
    conn: psycopg.AsyncConnection[dict[str, Any]],
    stmts: ReplayStatements,
    key: dict[str, str],
    *,
    dest: str,
    since: dt.datetime | None,
    restart: bool,
    actor: str,
    reason: str | None,
    options: dict[str, Any],
) -> tuple[bool, dt.datetime | None, str | None, int | None, int, dt.datetime]:
    if restart:
        await conn.execute(stmts.reset, key)
    row = await _cursor_row(conn, stmts, key)
    if row is None:
        await conn.execute(
            stmts.start,
            {**key, "destination": dest, "since": since, "actor": actor, "reason": reason,
             "options": json.dumps(options)},
        )  # fmt: skip
        row = await _cursor_row(conn, stmts, key)
        await conn.commit()
        assert row is not None  # inserted just now, in this transaction
        return False, since, None, None, 0, row["started_at"]
    old_dest, old_since = row["destination"], row["since"]
    last_key, last_seq, replayed = row["last_key"], row["last_seq"], row["replayed"]
    if old_dest != dest:
        raise ConfigurationError(
            f"the replay of topic {key['topic']!r} to {key['consumer']!r} went to "
            f"{old_dest!r}, not {dest!r}: pass --destination {old_dest!r} to continue it, "
            "or --restart to start over"
        )
    if since is not None and old_since != since:
        raise ConfigurationError(
            f"the replay of topic {key['topic']!r} to {key['consumer']!r} started with --since "
            f"{old_since.isoformat() if old_since else '(none)'}: leave --since out to "
            "continue it, or pass --restart to start over"
        )
    await conn.execute(stmts.resume, {**key, "actor": actor, "reason": reason})
    await conn.commit()
    return True, old_since, last_key, last_seq, int(replayed), row["started_at"]


async def _cursor_row(
    conn: psycopg.AsyncConnection[Any], stmts: ReplayStatements, key: dict[str, str]
) -> dict[str, Any] | None:
    """The (topic, consumer)'s cursor row, by column name; None before a first run."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(stmts.cursor, key)
        return await cur.fetchone()


async def _remaining(
    conn: psycopg.AsyncConnection[dict[str, Any]],
    stmts: ReplayStatements,
    topic: str,
    since: dt.datetime | None,
    last_key: str | None,
    last_seq: int | None,
) -> int:
    params = {"topic": topic, "since": since, "key": last_key, "seq": last_seq}
    row = await (await conn.execute(stmts.count, params)).fetchone()
    await conn.commit()
    return int(row["remaining"]) if row else 0


def _publisher(
    broker: str | Publisher, topic: str, dest: str, options: dict[str, Any] | None
) -> Publisher:
    if not isinstance(broker, str):
        return broker
    from relay.brokers import publisher_for_url

    return publisher_for_url(broker, destinations={topic: dest}, **(options or {}))


class _Run:
    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        stmts: ReplayStatements,
        publisher: Publisher,
        key: dict[str, str],
        dest: str,
        actor: str,
        reason: str | None,
        on_progress: Callable[[ReplayProgress], None] | None,
    ) -> None:
        self.conn, self.stmts, self.publisher = conn, stmts, publisher
        self.key, self.dest, self.actor, self.on_progress = key, dest, actor, on_progress
        self.reason = reason or f"replay to {key['consumer']} ({dest})"
        self.sent = 0
        self.origin: str | None = None
        self.total = 0
        self.replayed = 0
        self.last_key: str | None = None
        self.last_seq: int | None = None
        self.started = time.monotonic()
        #: the replay's dedup-id token (replay_token)
        self.token = ""

    async def go(
        self,
        database_url: str,
        since: dt.datetime | None,
        batch: int,
        rate: float | None,
        chunk_seconds: float,
    ) -> None:
        while True:
            more = await self._chunk(database_url, since, batch, rate, chunk_seconds)
            if not more:
                return

    async def _chunk(
        self,
        database_url: str,
        since: dt.datetime | None,
        batch: int,
        rate: float | None,
        chunk_seconds: float,
    ) -> bool:
        """Send from the cursor for up to ``chunk_seconds``; True when rows may be left."""
        deadline = time.monotonic() + chunk_seconds
        params = {
            "topic": self.key["topic"], "since": since, "key": self.last_key,
            "seq": self.last_seq,
        }  # fmt: skip
        connecting = psycopg.AsyncConnection.connect(database_url, row_factory=dict_row)
        async with await connecting as reader:
            await reader.set_read_only(True)
            async with reader.transaction(), reader.cursor(name="outbox_replay") as cur:
                await cur.execute(self.stmts.rows, params)
                while True:
                    rows = await cur.fetchmany(batch)
                    if not rows:
                        return False
                    await self._send([_envelope(r, self.token) for r in rows])
                    await self._pace(rate)
                    if time.monotonic() >= deadline:
                        return True

    async def _send(self, envelopes: list[Envelope]) -> None:
        envelopes = stamped(envelopes, self.origin)
        attempt = 0
        while envelopes:
            results = await self.publisher.publish_batch(envelopes)
            failed = next((i for i, r in enumerate(results) if r is not None), None)
            done = envelopes if failed is None else envelopes[:failed]
            if done:
                await self._advance(done)
            if failed is None:
                return
            error = results[failed]
            env = envelopes[failed]
            attempt += 1
            if isinstance(error, PermanentPublishError) or attempt >= MAX_BATCH_ATTEMPTS:
                raise ReplayError(
                    f"the broker refused message {env.id} (topic {env.topic!r}, key "
                    f"{env.key!r}, seq {env.seq}) to {self.dest!r}: {redact(error)}; "
                    f"{self.replayed} replayed so far are kept: fix the cause and run the "
                    "same command again to continue"
                )
            await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
            envelopes = envelopes[failed:]

    async def _advance(self, done: Sequence[Envelope]) -> None:
        last = done[-1]
        await self.conn.execute(
            self.stmts.advance,
            {
                **self.key, "key": last.key, "seq": last.seq, "count": len(done),
                "actor": self.actor, "reason": self.reason, "ids": [e.id for e in done],
                "keys": [e.key for e in done], "seqs": [e.seq for e in done],
            },
        )  # fmt: skip
        await self.conn.commit()
        self.sent += len(done)
        self.replayed += len(done)
        self.last_key, self.last_seq = last.key, last.seq
        if self.on_progress is not None:
            self.on_progress(
                ReplayProgress(
                    self.key["topic"], self.key["consumer"], self.dest, self.sent,
                    max(self.total, self.sent), self.replayed, self.last_key, self.last_seq,
                    time.monotonic() - self.started,
                )
            )  # fmt: skip

    async def _pace(self, rate: float | None) -> None:
        if rate is None:
            return
        ahead = self.sent / rate - (time.monotonic() - self.started)
        if ahead > 0:
            await asyncio.sleep(ahead)
