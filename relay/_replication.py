"""A logical replication stream (pgoutput) read over psycopg's libpq connection (COPY BOTH).

psycopg 3 has no replication helper, so this speaks the streaming replication protocol itself
on a ``replication=database`` connection: ``START_REPLICATION SLOT ... LOGICAL``, then CopyData
frames both ways. From the server: XLogData ('w') carrying pgoutput messages, and keepalives
('k'). To the server: standby status updates ('r') with the position up to which everything is
done (the slot's ``confirmed_flush_lsn``; the server keeps the WAL after it and sends it again
after a reconnect).

Of pgoutput we read Begin ('B': commit time), Relation ('R': which table an insert is of),
Insert ('I': a row of ``outbox_wal_pending``, the only table of the publication, whose
``record`` column is the message), Message ('M': a logical message with our prefix, what
writers of older versions emitted; pgoutput sends them whatever the publication holds when
``messages`` is on, PostgreSQL 14+) and Commit ('C': the end of the transaction's WAL).
Transactions arrive whole and in commit order; empty ones are not sent (PostgreSQL 15+) or
carry no message.

The socket is waited on with the event loop, so an idle stream costs no CPU: the server sends
only when a transaction commits, and a keepalive every ``wal_sender_timeout / 2``. A reader task
receives and parses frames while the relay records and publishes earlier transactions, up to
``buffer`` records ahead; beyond that it stops reading and TCP holds the server back.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import struct
from dataclasses import dataclass, field

from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.kit import PREFIX
from relay._statements import TEMPLATES
from relay.exceptions import RelayError

__all__ = ["PENDING_TABLE", "CommittedTransaction", "ReplicationStream", "format_lsn"]

_PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
_XLOGDATA = struct.Struct(">QQq")  # start, end of WAL on the server, send time
_KEEPALIVE = struct.Struct(">Qqb")  # end of WAL on the server, send time, reply requested
_STATUS = struct.Struct(">cQQQqb")  # 'r', written, flushed, applied, now, reply requested
_BEGIN = struct.Struct(">Qqi")  # final LSN, commit time, xid
_COMMIT = struct.Struct(">bQQq")  # flags, commit LSN, end LSN, commit time
_MESSAGE_HEAD = struct.Struct(">bQ")  # flags (1: transactional), LSN
_PREFIX = PREFIX.encode()
_RELATION_HEAD = struct.Struct(">I")  # the relation's oid
_INSERT_HEAD = struct.Struct(">Ic")  # relation oid, 'N' (a new tuple)
_COLUMNS = struct.Struct(">h")
_LENGTH = struct.Struct(">i")
#: the table whose inserts carry the messages (outbox/schema.py OUTBOX_WAL_PENDING)
PENDING_TABLE = b"outbox_wal_pending"


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _text(message: bytes | str | None) -> str:
    if isinstance(message, bytes):
        return message.decode("utf-8", "replace").strip()
    return (message or "").strip()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _cstring(data: bytes, offset: int) -> tuple[bytes, int]:
    end = data.index(b"\x00", offset)
    return data[offset:end], end + 1


def _text_column(msg: bytes, offset: int, wanted: int) -> bytes | None:
    """The bytea column ``wanted`` of a TupleData in text format ('\\x' and hex digits)."""
    (count,) = _COLUMNS.unpack_from(msg, offset)
    offset += _COLUMNS.size
    for index in range(count):
        kind = msg[offset : offset + 1]
        offset += 1
        if kind in (b"n", b"u"):
            if index == wanted:
                return None
            continue
        (size,) = _LENGTH.unpack_from(msg, offset)
        offset += _LENGTH.size
        if index == wanted:
            return bytes.fromhex(msg[offset + 2 : offset + size].decode("ascii"))
        offset += size
    return None


def _pg_time(micros: int) -> dt.datetime:
    return _PG_EPOCH + dt.timedelta(microseconds=micros)


@dataclass
class CommittedTransaction:
    """One committed transaction's logical messages under our prefix, in their WAL order."""

    xid: int
    commit_time: dt.datetime
    end_lsn: int = 0
    records: list[bytes] = field(default_factory=list)


class ReplicationStream:
    """Streams committed transactions from one logical slot; see the module docstring."""

    def __init__(self, dsn: str, slot: str, publication: str, *, buffer: int = 10_000) -> None:
        self._dsn = dsn
        self._slot = slot
        self._publication = publication
        self._buffer = buffer
        self._pg: pq.abc.PGconn | None = None
        self._open: CommittedTransaction | None = None
        self._ready: collections.deque[CommittedTransaction] = collections.deque()
        self._ready_records = 0
        self._arrived = asyncio.Event()  # set while _ready holds a transaction
        self._taken = asyncio.Event()  # set when transactions were taken (room to read again)
        self._reader: asyncio.Task[None] | None = None
        #: relation oid -> index of the ``record`` column, for the pending table's relations
        self._relations: dict[int, int] = {}
        #: everything up to here is done (reported to the server as flushed)
        self.confirmed = 0
        #: the server's WAL end seen in the last frame: safe to confirm when nothing is open
        self._server_end = 0

    async def start(self) -> None:
        """Connect and start streaming after the slot's confirmed position."""
        # bytea in hex, whatever the role's or database's bytea_output says (_text_column)
        options = conninfo_to_dict(self._dsn).get("options") or ""
        conninfo = make_conninfo(
            self._dsn, replication="database", options=f"{options} -c bytea_output=hex".strip()
        )
        pg = await asyncio.to_thread(pq.PGconn.connect, conninfo.encode())
        if pg.status != pq.ConnStatus.OK:
            message = _text(pg.get_error_message())
            pg.finish()
            raise RelayError(f"could not open a replication connection: {message}")
        pg.nonblocking = 1
        self._pg = pg
        command = TEMPLATES.start_replication.format(
            slot=sql.Identifier(self._slot), publication=sql.Literal(self._publication)
        )
        pg.send_query(command.as_string(None).encode())
        while True:
            await self._flush()
            pg.consume_input()
            if not pg.is_busy():
                break
            await self._readable(5.0)
        result = pg.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            reason = _text(pg.get_error_message() if result is None else result.error_message)
            self.close()
            raise RelayError(f"could not stream from replication slot {self._slot!r}: {reason}")
        self._reader = asyncio.create_task(self._read(), name=f"replication:{self._slot}")

    @property
    def backend_pid(self) -> int:
        """The walsender's pid (the capture lease names it: a standby may end it)."""
        return self._conn().backend_pid

    def close(self) -> None:
        if self._reader is not None:
            if self._reader.done() and not self._reader.cancelled():
                self._reader.exception()  # retrieved: the caller has seen it or stops anyway
            self._reader.cancel()
            self._reader = None
        if self._pg is not None:
            self._pg.finish()
            self._pg = None

    async def transactions(self, limit: int, wait: float) -> list[CommittedTransaction]:
        """Committed transactions received so far, waiting up to ``wait`` seconds for the first
        one; stops taking more once they hold ``limit`` records. Raises :class:`RelayError`
        when the stream has ended."""
        if not self._ready:
            self._check_reader()
            try:
                async with asyncio.timeout(wait):
                    await self._arrived.wait()
            except TimeoutError:
                pass
        if not self._ready:
            self._check_reader()
        taken: list[CommittedTransaction] = []
        count = 0
        while self._ready and (not taken or count + len(self._ready[0].records) <= limit):
            tx = self._ready.popleft()
            taken.append(tx)
            count += len(tx.records)
        self._ready_records -= count
        if not self._ready:
            self._arrived.clear()
        if taken:
            self._taken.set()
        return taken

    @property
    def buffered(self) -> int:
        """Records received and parsed, not yet taken by :meth:`transactions`."""
        return self._ready_records

    def _check_reader(self) -> None:
        reader = self._reader
        if reader is None:
            raise RelayError("the replication stream is closed")
        if reader.cancelled():
            raise RelayError("the replication stream is closed")
        if reader.done():
            exc = reader.exception()
            raise exc if exc is not None else RelayError("the replication stream ended")

    async def _read(self) -> None:
        """Receive and parse frames as they come, while fewer than ``buffer`` records wait."""
        try:
            while True:
                self._receive()
                if self._ready_records >= self._buffer:
                    self._taken.clear()
                    await self._taken.wait()
                    continue
                await self._readable(None)
        finally:
            self._arrived.set()  # wake a waiting caller: it sees why the stream ended

    async def confirm(self, lsn: int | None = None) -> None:
        """Report everything up to ``lsn`` done (the server may recycle the WAL before it).
        Without ``lsn``: the server's WAL end, when no received transaction is pending."""
        if lsn is None:
            if self._open is not None or self._ready:
                lsn = self.confirmed
            else:
                lsn = max(self.confirmed, self._server_end)
        self.confirmed = max(self.confirmed, lsn)
        await self._send_status()

    # -- the protocol --------------------------------------------------------------------------

    def _conn(self) -> pq.abc.PGconn:
        if self._pg is None:
            raise RelayError("the replication stream is closed")
        return self._pg

    async def _readable(self, seconds: float | None) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        fd = self._conn().socket
        loop.add_reader(fd, _wake, ready)
        try:
            async with asyncio.timeout(seconds):
                await ready
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)

    async def _flush(self) -> None:
        pg = self._conn()
        while pg.flush() == 1:  # libpq's output buffer is full: wait for the socket
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(pg.socket, _wake, ready)
            try:
                await ready
            finally:
                loop.remove_writer(pg.socket)

    def _receive(self) -> None:
        """Parse the frames that have arrived, while fewer than ``buffer`` records wait. The
        socket is read only when libpq holds no complete frame, so neither the parsed records
        nor libpq's input buffer grow beyond one read past the bound."""
        pg = self._conn()
        read = False
        while self._ready_records < self._buffer:
            size, data = pg.get_copy_data(1)
            if size == 0:
                if read:
                    return
                pg.consume_input()
                read = True
                continue
            if size < 0:
                result = pg.get_result()
                message = _text(
                    result.error_message if result is not None else pg.get_error_message()
                )
                raise RelayError(f"the replication stream ended: {message or 'connection closed'}")
            self._frame(bytes(data))

    def _frame(self, frame: bytes) -> None:
        kind = frame[:1]
        if kind == b"w":
            _start, end, _sent = _XLOGDATA.unpack_from(frame, 1)
            self._server_end = max(self._server_end, end)
            self._pgoutput(frame[1 + _XLOGDATA.size :])
        elif kind == b"k":
            end, _sent, reply = _KEEPALIVE.unpack_from(frame, 1)
            self._server_end = max(self._server_end, end)
            if reply:
                self._reply_due = True

    _reply_due = False

    def _pgoutput(self, msg: bytes) -> None:
        kind = msg[:1]
        if kind == b"B":
            _final, commit_time, xid = _BEGIN.unpack_from(msg, 1)
            self._open = CommittedTransaction(xid & 0xFFFFFFFF, _pg_time(commit_time))
        elif kind == b"M":
            flags, _lsn = _MESSAGE_HEAD.unpack_from(msg, 1)
            rest = msg[1 + _MESSAGE_HEAD.size :]
            prefix, _, rest = rest.partition(b"\x00")
            (length,) = struct.unpack_from(">i", rest, 0)
            if prefix == _PREFIX and flags & 1 and self._open is not None:
                self._open.records.append(rest[4 : 4 + length])
        elif kind == b"R":
            self._relation(msg)
        elif kind == b"I":
            relid, _new = _INSERT_HEAD.unpack_from(msg, 1)
            column = self._relations.get(relid)
            if column is not None and self._open is not None:
                record = _text_column(msg, 1 + _INSERT_HEAD.size, column)
                if record is not None:
                    self._open.records.append(record)
        elif kind == b"C":
            _flags, _commit, end, _time = _COMMIT.unpack_from(msg, 1)
            tx, self._open = self._open, None
            if tx is not None:
                tx.end_lsn = end
                if tx.records:
                    self._ready.append(tx)
                    self._ready_records += len(tx.records)
                    self._arrived.set()
        # Type, origin and truncate messages: nothing of ours.

    def _relation(self, msg: bytes) -> None:
        """Note a relation of the pending table (sent before its first insert in a stream,
        and again after a change): the index of its ``record`` column."""
        (relid,) = _RELATION_HEAD.unpack_from(msg, 1)
        offset = 1 + _RELATION_HEAD.size
        _namespace, offset = _cstring(msg, offset)
        name, offset = _cstring(msg, offset)
        offset += 1  # replica identity
        (count,) = _COLUMNS.unpack_from(msg, offset)
        offset += _COLUMNS.size
        self._relations.pop(relid, None)
        if name != PENDING_TABLE:
            return
        for index in range(count):
            offset += 1  # flags
            column, offset = _cstring(msg, offset)
            offset += 8  # type oid, type modifier
            if column == b"record":
                self._relations[relid] = index

    async def keepalive(self) -> None:
        """Answer the server's keepalive if it asked (else it drops us after
        wal_sender_timeout), confirming what is done."""
        if self._reply_due:
            self._reply_due = False
            await self.confirm()

    async def _send_status(self) -> None:
        now = (dt.datetime.now(dt.UTC) - _PG_EPOCH) // dt.timedelta(microseconds=1)
        lsn = self.confirmed
        self._conn().put_copy_data(_STATUS.pack(b"r", lsn, lsn, lsn, now, 0))
        await self._flush()
