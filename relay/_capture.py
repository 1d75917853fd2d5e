"""WAL capture mode: the relay publishes what it decodes from the replication slot.

In 'wal' mode (``outbox capture enable``; docs/explanation/capture.md) writers emit each
message as a transactional logical message and touch no table. One relay of the group (the
holder of the capture lock, see ``outbox_capture_lock``, under a lease a standby can end: see
relay/_capture_lease.py) streams the slot; per batch of committed transactions, in ONE
database transaction on the lock's session, it:

1. drops ids that already have a row (a batch recorded before a crash, decoded again; an
   idempotency key published again);
2. numbers the rest per (topic, key) in arrival order = commit order (``outbox_capture_bump``:
   the counter rows stay locked until the batch commits);
3. sends them to the broker, except messages that must wait: delayed ones (``available_at``
   in the future) and those of keys with an earlier row the polling loop still has to publish;
4. records every message in ``outbox_messages`` while the broker confirms the sends (the two
   overlap): 'published', or 'pending' for the polling loop (which keeps running in this mode
   and owns retries, dead letters and delays); a send the broker refused turns its row, and
   its key's later rows of the batch, back to 'pending';
5. commits, waiting for the flush, and only then confirms the batch's end to the slot.

A crash anywhere before the commit rolls the numbering back, and the slot sends the same
transactions again from its confirmed position: they get the same seqs and ids (a broker that
received some of them already deduplicates by id where it can; the inbox always does). A crash
after the commit and before the confirmation decodes the batch again, and step 1 drops it.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import psycopg
from psycopg.rows import class_row, dict_row
from psycopg_pool import AsyncConnectionPool

from outbox.envelope import Envelope
from outbox.kit import MODE_WAL, RecordError, WalRecord, decode_record
from relay._capture_lease import CaptureLease, fence_lapsed_holder, standby_interval
from relay._config import RelayConfig
from relay._dispatch import Dispatcher
from relay._replication import CommittedTransaction, ReplicationStream
from relay._retry import Backoff, retry
from relay._slot import SlotHealth
from relay._state import RunState
from relay._statements import RelayStatements
from relay.exceptions import CaptureLeaseLostError

__all__ = ["WalCapture"]

log = logging.getLogger("relay")

#: how often a relay that is not capturing looks again (mode switched on, capturer gone)
RECHECK_SECONDS = 1.0
#: the longest a capturing relay waits for a transaction before confirming the idle stream
IDLE_WAIT_SECONDS = 0.5
#: how often a batch's recording looks whether a whole next batch has arrived to read ahead
_READ_AHEAD_POLL = 0.002
#: how often a slot that cannot capture this database is logged again while it lasts
REPORT_EVERY_SECONDS = 300.0


class _Setting(NamedTuple):
    """What to stream: the slot, its publication, and whether this is a drain (the database
    went back to polling while the slot still holds what writers emitted)."""

    slot: str
    publication: str
    draining: bool


@dataclass
class _Decoded:
    record: WalRecord
    created_at: dt.datetime
    seq: int = 0
    status: str = "published"
    attempts: int = 0
    error: str | None = None


class WalCapture:
    """The capture side of a relay in 'wal' mode; ``run()`` until the relay stops."""

    def __init__(
        self,
        config: RelayConfig,
        pool: AsyncConnectionPool[Any],
        stmts: RelayStatements,
        dispatcher: Dispatcher,
        state: RunState,
    ) -> None:
        self._config = config
        self._pool = pool
        self._stmts = stmts
        self._dispatcher = dispatcher
        self._state = state
        #: True while this relay holds the capture lock and streams the slot
        self.capturing = False
        #: (slot, state, mode) of the slot problem last logged, and when to log it again
        self._reported: tuple[str, str, str] | None = None
        self._report_again = 0.0

    async def run(self) -> None:
        async def capture_once() -> None:
            setting = await self._setting()
            if setting is None:
                await self._state.sleep(RECHECK_SECONDS)
            else:
                await self._lead(*setting)
                if setting.draining:  # drained: let the slot rest (an operator may drop it now)
                    await self._state.sleep(RECHECK_SECONDS)

        backoff = Backoff(0.1, 5.0)
        while not self._state.stopping:
            # returns after a round: not in 'wal' mode, a standby, drained, or the stream ended
            await retry("WAL capture", capture_once, backoff, state=self._state)

    async def _setting(self) -> _Setting | None:
        """(slot, publication, draining): streaming in 'wal' mode; draining after a switch
        back to polling while the slot exists (what writers emitted before the switch, or in
        transactions that commit after it, is still published); None: nothing to stream, or
        the slot cannot capture this database (missing, another database's, invalidated:
        logged as an error, see :meth:`_report`; writers write rows meanwhile)."""
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(self._stmts.capture_mode)).fetchone()
            if row is None:
                return None
            mode, slot, publication = row["mode"], row["slot"], row["publication"]
            if slot is None:
                return None
            async with conn.cursor(row_factory=class_row(SlotHealth)) as cur:
                await cur.execute(self._stmts.capture_slot, {"slot": slot})
                health = await cur.fetchone()
            assert health is not None  # one row, also for a missing slot
        self._report(health, str(mode))
        if health.state != "ok":
            return None  # not a slot of ours to stream (after a drain and a drop: all done)
        return _Setting(str(slot), str(publication), mode != MODE_WAL)

    def _report(self, health: SlotHealth, mode: str) -> None:
        """Log a slot that cannot capture this database, at once and then every
        :data:`REPORT_EVERY_SECONDS` while it lasts, with its recovery (the metrics and `outbox
        status` show it too)."""
        problem = health.problem(mode)
        seen = (health.slot, health.state, mode) if problem else None
        now = time.monotonic()
        if problem and (seen != self._reported or now >= self._report_again):
            log.error("relay %s: %s", self._config.relay_id, problem)
            self._report_again = now + REPORT_EVERY_SECONDS
        elif seen is None and self._reported is not None and health.state == "ok":
            log.warning(
                "relay %s: replication slot %s captures this database again",
                self._config.relay_id,
                health.slot,
            )
        self._reported = seen

    async def _lead(self, slot: str, publication: str, draining: bool) -> None:
        """Take the capture lock and stream, until stopped, drained, the stream fails or the
        lease is lost. A standby tries the lock, and fences a holder whose lease lapsed
        (relay/_capture_lease.py), every standby interval for a second, then returns."""
        config = self._config
        lock = await psycopg.AsyncConnection.connect(config.database_url, autocommit=True)
        try:
            if not await self._acquire(lock, slot):
                return  # a standby: another relay captures
            lease = CaptureLease(self._stmts, slot, config.relay_id, config.lease_seconds)
            await lease.take(lock)
            # A walsender still on the slot is a fenced holder's that has not exited yet:
            # the lock says the slot is ours now.
            await lock.execute(self._stmts.capture_slot_free, {"slot": slot})
            stream = ReplicationStream(
                config.database_url, slot, publication, buffer=max(4 * config.batch_size, 1000)
            )
            await stream.start()
            heartbeat: asyncio.Task[None] | None = None
            try:
                await lease.streaming(lock, stream.backend_pid)
                heartbeat = asyncio.create_task(lease.heartbeat(self._pool))
                self.capturing = True
                if not draining:
                    log.info("relay %s: capturing from replication slot %s (lease epoch %d)",
                             config.relay_id, slot, lease.epoch)
                await self._stream(lock, stream, lease, draining)
            except Exception:
                try:
                    lease.check()
                except CaptureLeaseLostError:
                    return  # fenced: that explains the closed connections (logged)
                raise
            finally:
                self.capturing = False
                stream.close()
                if heartbeat is not None:
                    heartbeat.cancel()
                    await asyncio.gather(heartbeat, return_exceptions=True)
        finally:
            await lock.close()

    async def _acquire(self, lock: psycopg.AsyncConnection[Any], slot: str) -> bool:
        """Take the capture lock; while another relay holds it, fence that relay if its lease
        lapsed, and try again every standby interval for a recheck period."""
        interval = standby_interval(self._config.lease_seconds)
        until = time.monotonic() + RECHECK_SECONDS
        while not self._state.stopping:
            cur = lock.cursor(row_factory=dict_row)
            row = await (await cur.execute(self._stmts.capture_lock, {"slot": slot})).fetchone()
            if row and row["locked"]:
                return True
            if await fence_lapsed_holder(lock, self._stmts, slot):
                continue  # its sessions are gone: the lock is free now
            if time.monotonic() >= until:
                break
            await self._state.sleep(interval)
        return False

    async def _stream(
        self,
        conn: psycopg.AsyncConnection[Any],
        stream: ReplicationStream,
        lease: CaptureLease,
        draining: bool,
    ) -> None:
        """Record what the slot sends; when it goes idle, return if there is nothing more to
        wait for (draining, or the database switched back to polling meanwhile)."""
        limit = self._config.batch_size
        # One batch is recorded (numbered, sent, written, committed) while the next one is
        # taken from the stream and decoded: its database work starts only once the batch
        # before it has committed, so a batch that rolls back never leaves its seqs to another.
        recording: tuple[asyncio.Task[None], int] | None = None
        try:
            while not self._state.stopping:
                lease.check()
                if recording is None:
                    transactions = await stream.transactions(limit, IDLE_WAIT_SECONDS)
                else:
                    # Read ahead once a whole batch is waiting (a backlog); else take what came
                    # while the batch was recorded, as one batch (at a trickle, batches grow
                    # with the load instead of splitting into one transaction each).
                    task = recording[0]
                    while not task.done() and stream.buffered < limit:
                        await asyncio.wait({task}, timeout=_READ_AHEAD_POLL)
                    transactions = await stream.transactions(limit, 0.0)
                batch = _decode(transactions)
                if recording is not None:
                    task, end_lsn = recording
                    recording = None
                    await task
                    lease.check()  # a takeover may have started while the batch was recorded
                    await stream.confirm(end_lsn)
                    if not transactions:
                        await stream.keepalive()  # nothing taken and not recorded: safe
                        continue
                if transactions:
                    recording = (
                        asyncio.create_task(self._record(conn, lease, batch)),
                        transactions[-1].end_lsn,
                    )
                    continue  # nothing taken from the stream is confirmed before it is recorded
                lease.check()
                await stream.confirm()  # idle: nothing of ours up to the server's WAL end
                if draining:
                    return
                setting = await self._setting()
                if setting is None or setting.draining:
                    return  # switched back to polling: drain in rounds from now on
                await stream.keepalive()
            if recording is not None:  # stopping: the batch in hand ends (recorded, confirmed)
                task, end_lsn = recording
                recording = None
                await task
                lease.check()
                await stream.confirm(end_lsn)
        finally:
            if recording is not None:  # failed on the way: its transaction rolls back
                recording[0].cancel()
                await asyncio.gather(recording[0], return_exceptions=True)

    async def _record(
        self,
        conn: psycopg.AsyncConnection[Any],
        lease: CaptureLease,
        batch: list[_Decoded],
    ) -> None:
        """Number, send and record one decoded batch, in one transaction on the lock's session
        (module docstring), under the lease."""
        started = time.perf_counter()
        if not batch:
            return
        stmts = self._stmts
        metrics = self._dispatcher.metrics
        async with conn.transaction():
            # The slot is confirmed right after this commit, so the commit must be on disk
            # first: the relay's sessions otherwise commit without waiting for the flush
            # (relay_session), and a slot position saved ahead of a lost commit would skip
            # the batch after a server crash.
            # The first three statements go in one round trip (a pipeline).
            async with conn.pipeline():
                await conn.execute(stmts.capture_durable)
                checking = await lease.send_check_in(conn)
                ids = [d.record.id for d in batch]
                cur = await conn.cursor(row_factory=dict_row).execute(
                    stmts.capture_known, {"ids": ids}
                )
                lease.checked_in(await checking.fetchone())
                known = {r["id"] for r in await cur.fetchall()}
            if known:
                batch = [d for d in batch if d.record.id not in known]
                if not batch:
                    return
            waiting = await self._number(conn, batch)
            to_send = self._hold_back(batch, waiting)
            # The database and the broker overlap: the rows are written as if every send
            # succeeds while the broker confirms them; a failed send is put right below.
            # Nothing commits before both are done.
            sending = asyncio.ensure_future(
                self._dispatcher.publish(
                    [_envelope(d) for d in to_send],
                    lease.publish_deadline(self._config.publish_timeout),
                )
            )
            try:
                await conn.execute(stmts.capture_record, _record_params(batch))
            finally:
                results, unreachable = await sending
            lease.check()  # a lapsed lease commits nothing (its sends stopped at the deadline)
            if unreachable and results:
                # The broker is down: the polling loop pauses too, and the messages wait for
                # it as pending rows. An outage is never a message's attempt (as in polling).
                self._dispatcher.pause(results[0])
            unsent = _unsent(to_send, results, unreachable)
            if unsent:
                await conn.execute(stmts.capture_unsent, _unsent_params(unsent))
        published = collections.Counter(d.record.topic for d in batch if d.status == "published")
        failed = collections.Counter(d.record.topic for d in batch if d.error is not None)
        for topic, n in published.items():
            metrics.published.labels(topic).inc(n)
        for topic, n in failed.items():
            metrics.failed.labels(topic).inc(n)
        metrics.batch_seconds.observe(time.perf_counter() - started)
        if any(d.status == "pending" for d in batch):
            self._state.wake.set()  # the polling loop has work

    async def _number(
        self, conn: psycopg.AsyncConnection[Any], batch: list[_Decoded]
    ) -> set[tuple[str, str]]:
        """Number the batch per key; return the keys with an earlier row the polling loop
        must publish first. Both statements go in one round trip (a pipeline), the counters'
        upsert first: once it holds the keys' counter rows, no writer adds a row to them."""
        counts: dict[tuple[str, str], int] = {}
        for d in batch:
            key = (d.record.topic, d.record.key)
            counts[key] = counts.get(key, 0) + 1
        keys = sorted(counts)
        bump = {
            "topics": [k[0] for k in counts],
            "keys": [k[1] for k in counts],
            "counts": list(counts.values()),
        }
        waiting = {
            "topics": [k[0] for k in keys],
            "keys": [k[1] for k in keys],
            **self._config.dead_policy_params(),
        }
        async with conn.pipeline():
            bumped = await conn.cursor(row_factory=dict_row).execute(self._stmts.capture_bump, bump)
            held = await conn.cursor(row_factory=dict_row).execute(
                self._stmts.capture_waiting_keys, waiting
            )
            next_seq = {
                (r["topic"], r["key"]): r["last_seq"] - counts[(r["topic"], r["key"])] + 1
                for r in await bumped.fetchall()
            }
            waiting_keys = {(r["topic"], r["key"]) for r in await held.fetchall()}
        for d in batch:
            key = (d.record.topic, d.record.key)
            d.seq = next_seq[key]
            next_seq[key] += 1
        return waiting_keys

    def _hold_back(
        self, batch: list[_Decoded], waiting: set[tuple[str, str]]
    ) -> list[_Decoded]:
        """The messages to send now; the others become pending, and so do their keys' later
        messages (a key's order holds)."""
        now = dt.datetime.now(dt.UTC)
        # while the broker is down (the relay pauses), nothing is tried: all wait as pending
        paused = self._dispatcher.paused_until > time.monotonic()
        send: list[_Decoded] = []
        for d in batch:
            key = (d.record.topic, d.record.key)
            due = d.record.available_at is None or d.record.available_at <= now
            if (
                key in waiting
                or not due
                or paused
                or self._dispatcher.at_most_once(d.record.topic)
            ):
                d.status = "pending"
                waiting.add(key)
            else:
                send.append(d)
        return send


def _decode(transactions: list[CommittedTransaction]) -> list[_Decoded]:
    """The batch's messages in commit order; one id once (the first wins, as a row would)."""
    seen: set[uuid.UUID] = set()
    out: list[_Decoded] = []
    for tx in transactions:
        for data in tx.records:
            try:
                record = decode_record(data)
            except RecordError as exc:
                # Not written by outbox-inbox (ours are checked before they are emitted): it
                # cannot be published, and stopping here would stop every message behind it.
                log.error("relay: skipped a malformed WAL record of transaction %s: %s",
                          tx.xid, exc)
                continue
            if record.id in seen:
                continue
            seen.add(record.id)
            out.append(_Decoded(record, tx.commit_time))
    return out


def _unsent(
    sent: list[_Decoded], results: list[BaseException | None], unreachable: bool
) -> list[_Decoded]:
    """The sent messages the broker did not take, now pending for the polling loop (which
    retries them with the relay's backoff and dead letters), and their keys' later messages of
    the batch, which stay behind them."""
    failed_keys: set[tuple[str, str]] = set()
    unsent: list[_Decoded] = []
    for d, result in zip(sent, results, strict=True):
        key = (d.record.topic, d.record.key)
        if result is not None or key in failed_keys:
            failed_keys.add(key)
            d.status = "pending"
            if result is not None:
                d.attempts = 0 if unreachable else 1
                d.error = f"{type(result).__name__}: {result}"
            unsent.append(d)
    return unsent


def _unsent_params(unsent: list[_Decoded]) -> dict[str, Any]:
    return {
        "ids": [d.record.id for d in unsent],
        "attempts": [d.attempts for d in unsent],
        "errors": [d.error for d in unsent],
    }


def _envelope(d: _Decoded) -> Envelope:
    r = d.record
    return Envelope(
        id=r.id,
        topic=r.topic,
        key=r.key,
        seq=d.seq,
        payload=r.payload,
        content_type=r.content_type,
        headers=orjson.loads(r.headers) if r.headers not in ("", "{}") else {},
        traceparent=r.traceparent,
        created_at=d.created_at,
    )


def _record_params(batch: list[_Decoded]) -> dict[str, Any]:
    return {
        "ids": [d.record.id for d in batch],
        "topics": [d.record.topic for d in batch],
        "keys": [d.record.key for d in batch],
        "seqs": [d.seq for d in batch],
        "headers": [d.record.headers or "{}" for d in batch],
        "payloads": [d.record.payload for d in batch],
        "content_types": [d.record.content_type for d in batch],
        "traceparents": [d.record.traceparent for d in batch],
        "created_ats": [d.created_at for d in batch],
        "available_ats": [d.record.available_at for d in batch],
        "statuses": [d.status for d in batch],
        "attempts": [d.attempts for d in batch],
        "errors": [d.error for d in batch],
    }
