"""WAL capture mode: the relay publishes what it decodes from the replication slot.

In 'wal' mode (``outbox capture enable``; docs/explanation/capture.md) writers insert each
message as one row of ``outbox_wal_pending`` (its id and record: no counter, no lock). One
relay of the group (the holder of the capture lock, see ``outbox_capture_lock``, under a lease
a standby can end and a watchdog ends when the loop stalls: relay/_capture_lease.py) streams
the slot, which decodes those inserts in commit order. Per batch of committed transactions,
on the lock's session:

1. in one transaction, committed on disk before anything is sent: drop ids that already have
   a row in ``outbox_messages`` (a batch recorded before a crash, decoded again; an
   idempotency key published again); number the rest per (topic, key) in arrival order =
   commit order (``outbox_capture_bump``); record them all 'pending', those about to be sent
   under this batch's lease; and delete their pending rows. From here on a seq is bound to its
   message: nothing can give it to another;
2. send them to the broker, except messages that must wait (delayed, behind an earlier row of
   their key the polling loop must publish first, at-most-once topics): the polling loop owns
   those;
3. mark the sent ones published and give the refused ones (with their keys' later messages)
   back to the polling loop, fenced by the batch's lease token; then confirm the batch's end
   to the slot.

A relay that dies after step 1 leaves leased rows: when the lease ends, the polling loop
publishes them with their seqs (the inbox absorbs what was sent already).

The slot is a low-latency path over the table, not the record: a relay that finds its slot
missing or invalidated (dropped, ``max_slot_wal_keep_size``, a failover or a restore without
it) creates a fresh one and, before it streams, publishes every row the table holds (the
sweep: each key in the order its rows were written); one that cannot use it (another
database's, another plugin, no publication) publishes from the table alone, a second slower.
A streaming relay whose stream is idle also sweeps rows that have waited in the table for a
while (a slot that is behind where the table says, or that skipped a transaction), so no row
is left behind whatever happened to the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from relay._claim import Claim, Outcome, decide
from relay._config import RelayConfig
from relay._dispatch import Dispatcher
from relay._fence import BatchFence
from relay._replication import CommittedTransaction, ReplicationStream
from relay._retry import Backoff, retry
from relay._slot import SlotHealth
from relay._state import RunState
from relay._statements import RelayStatements
from relay.exceptions import CaptureLeaseLostError, RelayError

__all__ = [
    "WalCapture",
    "batches",
    "decode_rows",
    "ledger_round",
    "ledger_rows",
    "number_batch",
    "store_batch",
]

log = logging.getLogger("relay")

#: how often a relay that is not capturing looks again (mode switched on, capturer gone)
RECHECK_SECONDS = 1.0
#: the longest a capturing relay waits for a transaction before confirming the idle stream
IDLE_WAIT_SECONDS = 0.5
#: how often a batch's recording looks whether a whole next batch has arrived to read ahead
_READ_AHEAD_POLL = 0.002
#: how often a slot that cannot capture this database is logged again while it lasts
REPORT_EVERY_SECONDS = 300.0
#: a pending row this old while the stream is idle was not delivered by the slot: swept
SWEEP_AGE_SECONDS = 2.0
#: how often an idle stream looks for such rows
SWEEP_EVERY_SECONDS = 1.0
#: the slot states a capturing relay repairs itself (a fresh slot)
_RECREATE = ("missing", "invalidated")


class _Setting(NamedTuple):
    """What to stream: the slot, its publication, and its state ('ok', or what the capturing
    relay repairs or works around: see the module docstring)."""

    slot: str
    publication: str
    state: str = "ok"


@dataclass
class _Decoded:
    record: WalRecord
    created_at: dt.datetime
    seq: int = 0
    status: str = "published"


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

        backoff = Backoff(0.1, 5.0)
        while not self._state.stopping:
            # returns after a round: not migrated, a standby, the mode changed, or the stream ended
            await retry("WAL capture", capture_once, backoff, state=self._state)

    async def _setting(self) -> _Setting | None:
        """What to do in 'wal' mode: stream the slot (also when it is missing or invalidated:
        the capturing relay makes a fresh one, or publishes from the table alone when it
        cannot). None: nothing to do ('polling' mode, or not migrated)."""
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(self._stmts.capture_mode)).fetchone()
            if row is None:
                return None
            mode, slot, publication = row["mode"], row["slot"], row["publication"]
            if mode != MODE_WAL or slot is None:
                return None  # 'polling' mode: the ledger reader's (relay/_ledger.py)
            async with conn.cursor(row_factory=class_row(SlotHealth)) as cur:
                await cur.execute(self._stmts.capture_slot, {"slot": slot})
                health = await cur.fetchone()
            assert health is not None  # one row, also for a missing slot
        self._report(health, str(mode))
        return _Setting(str(slot), str(publication), health.state)

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

    async def _lead(self, slot: str, publication: str, state: str) -> None:
        """Take the capture lock and stream, until stopped, the mode changes, the stream fails
        or the lease is lost. A standby tries the lock, and fences a
        holder whose lease lapsed (relay/_capture_lease.py), every standby interval for a
        second, then returns."""
        config = self._config
        lock = await psycopg.AsyncConnection.connect(config.database_url, autocommit=True)
        try:
            # as every relay session: a mark lost in a crash leaves its rows pending (sent
            # again); the batch's own transaction waits for its flush (capture_durable)
            await lock.execute(self._stmts.session)
            if not await self._acquire(lock, slot):
                return  # a standby: another relay captures
            recovered = False
            if state in _RECREATE:
                recovered = await self._recreate(lock, slot, state)
                state = "ok" if recovered else state
            lease = CaptureLease(self._stmts, slot, config.relay_id, config.lease_seconds)
            await lease.take(lock)
            leader = asyncio.current_task()
            heartbeat = asyncio.create_task(
                lease.heartbeat(self._pool, on_stall=lambda: _cancel(leader))
            )
            try:
                await self._lead_held(lock, lease, slot, publication, state, recovered)
            except Exception:
                try:
                    lease.check()
                except CaptureLeaseLostError:
                    return  # fenced, or the watchdog ended it: that explains the failure
                raise
            except asyncio.CancelledError:
                if lease.stalled and not self._state.stopping:
                    return  # the watchdog ended a stuck round (logged): try again
                raise
            finally:
                self.capturing = False
                heartbeat.cancel()
                # never wait long on it: a heartbeat stuck in I/O must not keep the lock
                await asyncio.wait({heartbeat}, timeout=1.0)
        finally:
            await lock.close()

    async def _lead_held(
        self,
        lock: psycopg.AsyncConnection[Any],
        lease: CaptureLease,
        slot: str,
        publication: str,
        state: str,
        recovered: bool,
    ) -> None:
        """The capture lock is held: publish what the table holds when the slot was just made
        (or cannot be used), then stream the slot."""
        config = self._config
        if recovered or state != "ok":
            swept = await self._sweep(lock, lease, 0.0)
            if recovered:
                self._dispatcher.metrics.capture_recovered.labels(slot).inc()
                log.warning(
                    "relay %s: published %d message(s) from the outbox_wal_pending table that "
                    "the slot had not delivered; streaming the fresh slot %s from here on",
                    config.relay_id,
                    swept,
                    slot,
                )
        if state != "ok":
            # not a slot we can stream (another database's, another plugin, not creatable):
            # the table is the path, swept every second until the next look at the setting
            until = time.monotonic() + RECHECK_SECONDS
            while not self._state.stopping and time.monotonic() < until:
                lease.progress()
                await self._sweep(lock, lease, 0.0)
                await self._state.sleep(min(RECHECK_SECONDS, config.poll_interval * 5))
            return
        # A walsender still on the slot is a fenced holder's that has not exited yet:
        # the lock says the slot is ours now.
        await lock.execute(self._stmts.capture_slot_free, {"slot": slot})
        stream = ReplicationStream(
            config.database_url, slot, publication, buffer=max(4 * config.batch_size, 1000)
        )
        try:
            await stream.start()
        except RelayError as exc:
            # e.g. the publication is gone (a restore without it): the table is the path
            log.error(
                "relay %s: %s; publishing from the outbox_wal_pending table meanwhile",
                config.relay_id,
                exc,
            )
            await self._sweep(lock, lease, 0.0)
            raise
        try:
            await lease.streaming(lock, stream.backend_pid)
            self.capturing = True
            log.info(
                "relay %s: capturing from replication slot %s (lease epoch %d)",
                config.relay_id,
                slot,
                lease.epoch,
            )
            await self._stream(lock, stream, lease)
        except RelayError:
            # the stream failed (its publication is gone, a walsender error): what waited in
            # the table meanwhile is not left for the slot alone
            stream.close()
            if lease.lost is None:
                await self._sweep(lock, lease, SWEEP_AGE_SECONDS)
            raise
        finally:
            stream.close()

    async def _recreate(self, lock: psycopg.AsyncConnection[Any], slot: str, state: str) -> bool:
        """Make a fresh slot in place of a missing or invalidated one (the capture lock is
        held, so one relay does it); True when the slot is usable now. Everything committed
        after the fresh slot's consistent point is decoded from it; everything committed before
        is in the pending table, which :meth:`_sweep` publishes before the stream starts."""
        try:
            if state == "invalidated":
                with contextlib.suppress(psycopg.errors.UndefinedObject):
                    await lock.execute(self._stmts.slot_drop, {"slot": slot})
            with contextlib.suppress(psycopg.errors.DuplicateObject):  # made meanwhile
                await lock.execute(self._stmts.slot_create, {"slot": slot})
        except psycopg.Error as exc:
            log.error(
                "relay %s: replication slot %s is %s and this relay could not make a fresh one "
                "(%s): publishing from the outbox_wal_pending table meanwhile (nothing is "
                "lost; latency grows to about a second)",
                self._config.relay_id,
                slot,
                state,
                str(exc).strip().splitlines()[0],
            )
            return False
        async with lock.cursor(row_factory=class_row(SlotHealth)) as cur:
            await cur.execute(self._stmts.capture_slot, {"slot": slot})
            health = await cur.fetchone()
        if health is None or health.state != "ok":
            return False
        log.warning(
            "relay %s: replication slot %s was %s: created a fresh slot; publishing what the "
            "outbox_wal_pending table holds before streaming it (no message is lost)",
            self._config.relay_id,
            slot,
            state,
        )
        self._reported = None
        return True

    async def _sweep(
        self,
        lock: psycopg.AsyncConnection[Any],
        lease: CaptureLease,
        older: float,
    ) -> int:
        """Publish the pending table's rows written at least ``older`` seconds ago, oldest
        first, in batches, until none is left; return how many messages were recorded."""
        total = 0
        limit = self._config.batch_size
        while not self._state.stopping:
            lease.progress()
            ids = await ledger_round(lock, self._stmts, older, limit)
            for chunk in batches(ids, limit):
                if self._state.stopping:
                    break
                lease.progress()
                rows = await ledger_rows(lock, self._stmts, chunk)
                if rows:
                    total += await self.record(lock, lease, decode_rows(rows), chunk) or 0
            if len(ids) < limit * ROUND_BATCHES:
                break
        return total

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
    ) -> None:
        """Record what the slot sends; when it goes idle, return if the database switched back
        to polling meanwhile (the table is the path then)."""
        limit = self._config.batch_size
        # One batch is recorded (numbered, sent, written, committed) while the next one is
        # taken from the stream and decoded: its database work starts only once the batch
        # before it has committed, so a batch that rolls back never leaves its seqs to another.
        recording: tuple[asyncio.Task[int | None], int] | None = None
        sweep_at = time.monotonic() + SWEEP_EVERY_SECONDS
        try:
            while not self._state.stopping:
                lease.check()
                lease.progress()
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
                        asyncio.create_task(self.record(conn, lease, batch)),
                        transactions[-1].end_lsn,
                    )
                    continue  # nothing taken from the stream is confirmed before it is recorded
                lease.check()
                await stream.confirm()  # idle: nothing of ours up to the server's WAL end
                if time.monotonic() >= sweep_at:
                    # caught up: a row still pending since a while ago was not delivered
                    await self._sweep(conn, lease, SWEEP_AGE_SECONDS)
                    sweep_at = time.monotonic() + SWEEP_EVERY_SECONDS
                setting = await self._setting()
                if setting is None:
                    return  # switched back to polling: the ledger reader's from now on
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

    async def record(
        self,
        conn: psycopg.AsyncConnection[Any],
        fence: BatchFence,
        batch: list[_Decoded],
        pending_ids: list[uuid.UUID] | None = None,
    ) -> int | None:
        """Number and record one batch (committed on disk), then send it and mark what the
        broker took, on ``conn`` (module docstring), under ``fence`` (the capture lease, or in
        'polling' mode the ledger's: relay/_fence.py). ``pending_ids``: the ledger rows to
        delete (default: the batch's). Returns how many were recorded; None when the fence
        refused (another relay numbers: nothing was done)."""
        started = time.perf_counter()
        stmts = self._stmts
        ids = [d.record.id for d in batch]
        doomed = ids if pending_ids is None else pending_ids
        if not doomed:
            return 0
        token = uuid.uuid4()
        to_send: list[_Decoded] = []
        async with conn.transaction():
            if not await fence.enter(conn):
                return None
            batch, waiting = await number_batch(conn, stmts, self._config, batch, doomed, fence)
            if batch:
                to_send = self._hold_back(batch, waiting)
                await store_batch(conn, stmts, self._config, batch, token, send=True)
            fence.check()  # a lapsed lease commits nothing
        fence.progress()
        if to_send:
            await self._send(conn, fence, to_send, token)
        if any(d.status == "pending" for d in batch):
            # the claim loops have work: this relay's at once, the others' on the write counter
            await conn.execute(stmts.capture_recorded)
            self._state.wake.set()
        self._dispatcher.metrics.batch_seconds.observe(time.perf_counter() - started)
        return len(batch)

    async def _send(
        self,
        conn: psycopg.AsyncConnection[Any],
        fence: BatchFence,
        to_send: list[_Decoded],
        token: uuid.UUID,
    ) -> None:
        """Send the recorded batch's messages and settle each as a claim's would be (one
        decision for both paths: relay/_claim.py ``decide``), fenced by the batch's token."""
        dispatcher = self._dispatcher
        envelopes = [_envelope(d) for d in to_send]
        deadline = fence.publish_deadline(self._config.publish_timeout)
        results, unreachable = await dispatcher.publish(envelopes, deadline)
        fence.progress()
        # a refused destination (a topic outside the grammar included) pauses its topic here
        # as on the claim path: its later messages wait as pending instead of each being tried
        dispatcher.note_destinations(envelopes, results)
        sent = Claim(token, envelopes, [1] * len(envelopes), deadline)
        if unreachable and results:
            # The broker is down: the polling loop pauses too, and the messages wait for it
            # as pending rows. An outage is never a message's attempt (as in polling).
            dispatcher.pause(results[0])
            outcomes = [Outcome(e.id, "release") for e in envelopes]
        else:
            outcomes = decide(sent, results, self._config)
        settled = {o.id: o for o in outcomes}
        published = [o.id for o in outcomes if o.action == "published"]
        unsent = [o for o in outcomes if o.action != "published"]
        async with conn.pipeline():
            if published:
                params = {"ids": published, "token": token}
                await conn.execute(self._stmts.capture_published, params)
            if unsent:
                await conn.execute(self._stmts.capture_unsent, _unsent_params(unsent, token))
        fence.progress()
        for d in to_send:
            if settled[d.record.id].action != "published":
                d.status = "pending"
        dispatcher.count(sent, outcomes)

    def _hold_back(self, batch: list[_Decoded], waiting: set[tuple[str, str]]) -> list[_Decoded]:
        """The messages to send now; the others become pending, and so do their keys' later
        messages (a key's order holds)."""
        now = dt.datetime.now(dt.UTC)
        # while the broker is down (the relay pauses), nothing is tried: all wait as pending
        paused = self._dispatcher.paused_until > time.monotonic()
        # a topic whose destination refuses messages waits for the claim loop's probe
        refused = set(self._dispatcher.destinations.paused())
        send: list[_Decoded] = []
        for d in batch:
            key = (d.record.topic, d.record.key)
            due = d.record.available_at is None or d.record.available_at <= now
            held = paused or d.record.topic in refused or self._dispatcher.at_most_once(key[0])
            if key in waiting or not due or held:
                d.status = "pending"
                waiting.add(key)
            else:
                send.append(d)
        return send


async def number_batch(
    conn: psycopg.AsyncConnection[Any],
    stmts: RelayStatements,
    config: RelayConfig,
    batch: list[_Decoded],
    doomed: list[uuid.UUID],
    lease: BatchFence | None,
) -> tuple[list[_Decoded], set[tuple[str, str]]]:
    """In the batch's transaction: drop the ids that already have a row, delete the batch's
    ledger rows, number the rest per key. Returns what is left and the keys with an earlier row
    the polling loop must publish first. The first four statements go in one round trip (a
    pipeline); so do the counters' upsert and the waiting keys' probe after them: once the
    upsert holds the keys' counter rows, no other batch adds a row to them."""
    ids = [d.record.id for d in batch]
    async with conn.pipeline():
        # Durable: the slot is confirmed after this batch, and its rows leave the ledger here
        # (the relay's sessions otherwise commit without waiting for the flush).
        await conn.execute(stmts.capture_durable)
        checking = await lease.send_check_in(conn) if lease is not None else None
        cur = await conn.cursor(row_factory=dict_row).execute(stmts.capture_known, {"ids": ids})
        await conn.execute(stmts.capture_pending_delete, {"ids": doomed})
        if lease is not None and checking is not None:
            lease.checked_in(await checking.fetchone())
        known = {r["id"] for r in await cur.fetchall()}
    if lease is not None:
        lease.progress()
    if known:
        batch = [d for d in batch if d.record.id not in known]
    if not batch:
        return batch, set()
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
        **config.dead_policy_params(),
    }
    async with conn.pipeline():
        bumped = await conn.cursor(row_factory=dict_row).execute(stmts.capture_bump, bump)
        held = await conn.cursor(row_factory=dict_row).execute(stmts.capture_waiting_keys, waiting)
        next_seq = {
            (r["topic"], r["key"]): r["last_seq"] - counts[(r["topic"], r["key"])] + 1
            for r in await bumped.fetchall()
        }
        waiting_keys = {(r["topic"], r["key"]) for r in await held.fetchall()}
    for d in batch:
        key = (d.record.topic, d.record.key)
        d.seq = next_seq[key]
        next_seq[key] += 1
    return batch, waiting_keys


async def store_batch(
    conn: psycopg.AsyncConnection[Any],
    stmts: RelayStatements,
    config: RelayConfig,
    batch: list[_Decoded],
    token: uuid.UUID,
    send: bool,
) -> None:
    """Record the numbered batch in its transaction: the messages about to be sent under the
    batch's lease (``token``), the others pending for the polling loop. ``send`` False: all of
    them pending, and the write counter moves (the claim loops of every relay look)."""
    if not send:
        for d in batch:
            d.status = "pending"
    params = {
        **_record_params(batch),
        "owner": config.relay_id,
        "token": token,
        "lease_seconds": config.lease_seconds,
    }
    await conn.execute(stmts.capture_record, params)
    if not send:
        await conn.execute(stmts.capture_recorded)


#: a round of the ledger's sweep takes the ids of this many batches in one scan and sort
ROUND_BATCHES = 40


async def ledger_round(
    conn: psycopg.AsyncConnection[Any], stmts: RelayStatements, older: float, limit: int
) -> list[uuid.UUID]:
    """The ids of the ledger's committed rows written at least ``older`` seconds ago, oldest
    first, for ``ROUND_BATCHES`` batches of ``limit`` at most (outbox_capture_pending_sweep)."""
    params = {"older": older, "limit": limit * ROUND_BATCHES}
    cur = conn.cursor(row_factory=dict_row)
    return [
        row["id"]
        for row in await (await cur.execute(stmts.capture_pending_sweep, params)).fetchall()
    ]


async def ledger_rows(
    conn: psycopg.AsyncConnection[Any], stmts: RelayStatements, ids: list[uuid.UUID]
) -> list[dict[str, Any]]:
    """The ledger rows of ``ids`` still there, in the order of ``ids``."""
    cur = conn.cursor(row_factory=dict_row)
    found = {
        r["id"]: r
        for r in await (await cur.execute(stmts.capture_pending_rows, {"ids": ids})).fetchall()
    }
    return [found[i] for i in ids if i in found]


def batches(ids: list[uuid.UUID], size: int) -> list[list[uuid.UUID]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def decode_rows(rows: list[dict[str, Any]]) -> list[_Decoded]:
    """The ledger rows' messages, in the given order; one id once; a malformed row logged and
    left out (its row is deleted with the batch's)."""
    batch: list[_Decoded] = []
    seen: set[uuid.UUID] = set()
    for row in rows:
        try:
            record = decode_record(bytes(row["record"]))
        except RecordError as exc:
            log.error("relay: skipped a malformed pending row %s: %s", row["id"], exc)
            continue
        if record.id in seen:
            continue
        seen.add(record.id)
        batch.append(_Decoded(record, row["written_at"]))
    return batch


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
                log.error(
                    "relay: skipped a malformed WAL record of transaction %s: %s", tx.xid, exc
                )
                continue
            if record.id in seen:
                continue
            seen.add(record.id)
            out.append(_Decoded(record, tx.commit_time))
    return out


def _unsent_params(unsent: list[Outcome], token: uuid.UUID) -> dict[str, Any]:
    """The rows of ``outbox_capture_unsent``: a refused send counts its attempt (dead at once
    when permanent or the last allowed), the rest of its key and every send of an outage count
    none (released)."""
    return {
        "token": token,
        "ids": [o.id for o in unsent],
        "dead": [o.action == "dead" for o in unsent],
        "attempts": [0 if o.action == "release" else 1 for o in unsent],
        "errors": [o.error for o in unsent],
        "delays": [o.delay for o in unsent],
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
    """The rows of ``outbox_capture_record``: those to be sent (status 'published' so far)
    carry the batch's lease."""
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
        "leased": [d.status == "published" for d in batch],
    }


def _cancel(task: asyncio.Task[Any] | None) -> None:
    """The watchdog's way to end a stuck round (its lease is already ended)."""
    if task is not None and not task.done():
        task.cancel()
