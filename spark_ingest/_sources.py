"""Reading the sources: the horizon, frozen in one statement per source, then parallel JDBC reads.

Why the result is consistent (failure-modes F4, F41):

* The horizon of each source is read in ONE statement (one snapshot): ``pg_snapshot_xmin`` of
  the current snapshot, the server clock, and the start of the oldest transaction still open in
  that database. Several statements would see several snapshots and could disagree.
* Outbox rows are judged only if ``tx_id < xmin``: every transaction below the snapshot's xmin
  has ended, so no row of a transaction still in flight at job start is ever judged (and no
  such row can appear later below the horizon). Spark's partition queries run in their own
  snapshots, later than the horizon; they all see every committed row below it.
* Inbox tables have no transaction id, so their horizon is a time: ``least(now, start of the
  oldest open transaction, oldest prepared transaction)``. A row inserted by a transaction still
  open has ``received_at >= xact_start``, so every row below that time is already committed.
"""

from __future__ import annotations

import datetime as dt
import itertools
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from outbox.kit import one_line, qualified
from outbox.schema import INBOX_MESSAGES, OUTBOX_MESSAGES
from spark_ingest._config import Source
from spark_ingest._errors import SourceError
from spark_ingest._statements import TEMPLATES, spark_statements

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "Horizon",
    "count_inbox",
    "count_outbox",
    "partitions_for",
    "read_horizon",
    "read_inbox",
    "read_outbox",
    "share_connections",
    "time_predicates",
    "time_ranges",
]


@dataclass(frozen=True)
class Horizon:
    """What one source looked like at job start."""

    source: str
    xmin: int
    now: dt.datetime
    safe_time: dt.datetime


def _connect(source: Source) -> psycopg.Connection[Any]:
    kw = source.libpq_kwargs()
    try:
        return psycopg.connect(connect_timeout=10, **kw)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        where = f"{kw['host']}:{kw['port']}/{kw['dbname']} as {kw.get('user', '(default user)')}"
        raise SourceError(
            f"source {source.name!r}: cannot connect to {where}: {first}. Check the URL, the "
            "user and the password (password_env / password_file)",
            source=source.name,
        ) from exc


def read_horizon(source: Source, table: str) -> Horizon:
    """Freeze the horizon of ``source`` and check that ``table`` exists there."""
    name = qualified(source.schema, table).as_string(None)
    try:
        with _connect(source) as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(spark_statements(source.schema).horizon, {"table": name}).fetchone()
    except psycopg.errors.UndefinedFunction as exc:  # outbox_oldest_xact_start(): outbox_0018
        raise SourceError(
            f"source {source.name!r}: table {name} does not exist in {source.jdbc_url}, or its "
            "schema is older than this version (no outbox_oldest_xact_start()): run `outbox "
            "migrate upgrade` there, or set the right schema",
            source=source.name,
            table=name,
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        user = source.login or "(default user)"
        raise SourceError(
            f"source {source.name!r}: cannot read the horizon in {source.jdbc_url} as {user}: "
            f"{one_line(str(exc))}; grant that user the reconciliation's rights: `outbox "
            f"migrate grants --reconcile {shlex.quote(user)} --apply` (EXECUTE on "
            "outbox_oldest_xact_start() and SELECT on the tables)",
            source=source.name,
            table=name,
            user=source.login,
        ) from exc
    assert row is not None
    xmin, now, safe_time, has_table = row["xmin"], row["now"], row["safe_time"], row["has_table"]
    if not has_table:
        raise SourceError(
            f"source {source.name!r}: table {name} does not exist in {source.jdbc_url}: run "
            "`outbox migrate upgrade` there, or set the right schema",
            source=source.name,
            table=name,
        )
    return Horizon(source.name, int(xmin), now, safe_time)


def connect(source: Source) -> psycopg.Connection[Any]:
    """A psycopg connection to ``source`` (errors translated to SourceError)."""
    return _connect(source)


#: How far back a server clock may step between an insert and its publish (see read_outbox).
_CLOCK_MARGIN = dt.timedelta(hours=1)


_US = dt.timedelta(microseconds=1)


def _utc(t: dt.datetime, what: str) -> dt.datetime:
    """``t`` in UTC. A naive time is refused: inside SQL it would be read in the JDBC session's
    time zone (the executor JVM's), not the one meant."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{what} {t.isoformat()} has no time zone; pass an aware datetime")
    return t.astimezone(dt.UTC)


def _ranges(lo: dt.datetime, hi: dt.datetime, n: int) -> list[tuple[dt.datetime, dt.datetime]]:
    """``[lo, hi)`` cut into at most ``n`` contiguous ranges of whole microseconds (UTC).

    The edges are computed in UTC on integer microseconds: ``lo + span * i // n``. Arithmetic
    on a zone with DST is wall-clock arithmetic in Python (an edge in a spring-forward gap maps
    to an instant after the next edge: two ranges overlap), and ``(hi - lo) / n`` rounds to the
    nearest microsecond, so for a window shorter than about n**2 / 2 microseconds the edges
    overshoot ``hi`` (ranges past the window, read by no one's choice). Never more ranges than
    microseconds, so no range is empty; ``lo >= hi`` gives the one range ``(lo, hi)`` (empty).
    """
    lo, hi = _utc(lo, "range start"), _utc(hi, "range end")
    span = (hi - lo) // _US
    if span <= 0:
        return [(lo, hi)]
    n = max(1, min(n, span))
    edges = [lo + dt.timedelta(microseconds=span * i // n) for i in range(n)] + [hi]
    return list(itertools.pairwise(edges))


def _range_sql(column: str, a: dt.datetime, b: dt.datetime) -> str:
    a, b = _utc(a, "range start"), _utc(b, "range end")
    return TEMPLATES.time_range.format(
        column=sql.SQL(column), lo=a.isoformat(), hi=b.isoformat()
    ).as_string(None)


def time_ranges(
    lo: dt.datetime, hi: dt.datetime, n: int, *, until: dt.datetime | None = None
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The ranges of :func:`time_predicates` (UTC), for tests and the row estimate."""
    stop = _utc(hi if until is None else until, "range end")
    ranges = _ranges(lo, min(_utc(hi, "range end"), stop), n)
    ranges[-1] = (ranges[-1][0], stop)
    return ranges


def time_predicates(
    column: str, lo: dt.datetime, hi: dt.datetime, n: int, *, until: dt.datetime | None = None
) -> list[str]:
    """Split ``[lo, hi)`` on ``column`` into ``n`` contiguous ranges, one per Spark partition;
    with ``until``, the last range runs on to ``until`` (the rows are ``[lo, until)``, split as
    if they ended at ``hi``). Fewer than ``n`` when the window has fewer microseconds.

    UUIDs cannot be a Spark partition column, so reads split on time (the bounds are our own
    ISO timestamps in UTC, never user text).
    """
    return [_range_sql(column, a, b) for a, b in time_ranges(lo, hi, n, until=until)]


def _outbox_predicate(a: dt.datetime, b: dt.datetime) -> str:
    """Outbox rows created in ``[a, b)``, stated so the partial indexes answer (read_outbox)."""
    floor = _utc(a, "range start") - _CLOCK_MARGIN
    return TEMPLATES.outbox_range.format(
        range=sql.SQL(_range_sql("created_at", a, b)), floor=floor.isoformat()
    ).as_string(None)


def count_rows(source: Source, table: str, predicate: str, limit: int) -> int:
    """``min(rows of table matching predicate, limit)``: one driver query, stopped at ``limit``.

    Sizes the reads (``_job.read_sources``); why it counts instead of asking the planner:
    ``count_rows`` in spark_ingest/statements.sql.
    """
    name = qualified(source.schema, table).as_string(None)
    query = TEMPLATES.count_rows.format(
        table=qualified(source.schema, table), predicate=sql.SQL(predicate), limit=int(limit)
    ).as_string(None)
    with _connect(source) as conn:
        try:
            row = conn.cursor(row_factory=dict_row).execute(query.encode()).fetchone()
        except psycopg.Error as exc:  # the read would fail alike: say it the same way
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise _read_error(source, name, cause[:300]) from exc
    assert row is not None
    return int(row["n"])


def count_outbox(source: Source, lo: dt.datetime, hi: dt.datetime, limit: int) -> int:
    """How many rows :func:`read_outbox` reads for ``[lo, hi)`` (at most ``limit``)."""
    return count_rows(source, OUTBOX_MESSAGES, _outbox_predicate(lo, hi), limit)


def count_inbox(
    source: Source,
    lo: dt.datetime,
    until: dt.datetime,
    limit: int,
    *,
    margin: dt.timedelta = _CLOCK_MARGIN,
) -> int:
    """How many rows :func:`read_inbox` reads from ``lo`` (less the margin) to ``until``."""
    start = _inbox_start(lo, margin)
    return count_rows(source, INBOX_MESSAGES, _range_sql("received_at", start, until), limit)


def _inbox_start(lo: dt.datetime, margin: dt.timedelta) -> dt.datetime:
    """``lo - margin`` as instants: on a zone with DST, Python subtracts on the wall clock (an
    hour before 03:30 CEST on the spring-forward day is 02:30, a time that does not exist and
    reads as 01:30 UTC: no margin at all)."""
    return _utc(lo, "window start") - margin


def partitions_for(rows: int, rows_per_partition: int) -> int:
    """``ceil(rows / rows_per_partition)``, one at least (an empty read is one partition)."""
    return max(1, -(-rows // rows_per_partition))


def share_connections(wanted: Sequence[int], cap: int) -> list[int]:
    """Partitions for the reads of one database: each at least one, their sum at most ``cap``.

    Each JDBC partition is one Spark task holding one connection while it runs, and the reads
    of one run may run at the same time, so bounding the sum of their partitions bounds the
    connections open at once. What each read wants when it all fits; else one each and the
    rest of ``cap`` shared in proportion to what each wants beyond one (largest remainders).
    """
    want = [max(1, w) for w in wanted]
    if len(want) > cap:
        raise ValueError(f"{len(want)} reads cannot share {cap} connections")
    if sum(want) <= cap:
        return want
    spare, extra = cap - len(want), [w - 1 for w in want]
    total = sum(extra)  # > spare, since sum(want) > cap
    got = [1 + e * spare // total for e in extra]
    by_remainder = sorted(range(len(want)), key=lambda i: (-(extra[i] * spare % total), i))
    for i in by_remainder[: cap - sum(got)]:
        got[i] += 1
    return got


# Exactly the columns the reconciliation uses (and the read floor of bench/reconcile.py fetches).


def _root_cause(exc: BaseException) -> str:
    """The first line of the deepest Java cause's message (for a read refused by the server,
    the PSQLException's ``ERROR: permission denied for table ...``), else of ``exc``.

    py4j's own message (``An error occurred while calling o39.jdbc.``) says nothing; the
    reason is at the bottom of the Java exception's cause chain.
    """
    message = ""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    for _ in range(20):  # a cause chain is short; never loop on a cyclic one
        if java is None:
            break
        try:
            text, java = java.getMessage(), java.getCause()
        except Exception:  # the JVM is gone or the object is not a Throwable
            break
        if text and str(text).strip():
            message = str(text)
    message = message.strip() or str(exc).strip() or type(exc).__name__
    return message.splitlines()[0][:300]


def _jdbc(
    spark: SparkSession,
    source: Source,
    query: str,
    predicates: list[str],
    *,
    table: str = "the outbox/inbox tables",
) -> DataFrame:
    try:
        return spark.read.jdbc(
            source.jdbc_url,
            f"({query}) AS src",
            predicates=predicates,
            properties=source.jdbc_properties(),
        )
    except Exception as exc:  # py4j / AnalysisException: translate, keep the cause
        raise _read_error(source, table, _root_cause(exc)) from exc


def _read_error(source: Source, table: str, cause: str) -> SourceError:
    """What a read (or the count before it) refused by the server says: the source, the
    table, the user, the server's reason and what to do."""
    user = source.login or "(default user)"
    hint = (
        f"grant that user SELECT: GRANT SELECT ON {table} TO {user}"
        if "permission denied" in cause
        else "check the URL, the user, the schema and the table"
    )
    return SourceError(
        f"source {source.name!r}: cannot read {table} in {source.jdbc_url} as {user}: "
        f"{cause}; {hint}",
        source=source.name,
        table=table,
        user=source.login,
    )


def read_outbox(
    spark: SparkSession,
    source: Source,
    lo: dt.datetime,
    hi: dt.datetime,
    partitions: int,
) -> DataFrame:
    """Outbox rows with ``lo <= created_at < hi`` (tx_id kept: the caller applies the horizon).

    There is no index on created_at, so a plain range predicate scans the whole table in every
    partition query: a night read 10 days to keep one. Each predicate therefore also says what
    is implied anyway, in terms the partial indexes answer: a published row was published after
    it was created (``published_at >= created_at``, same server clock; an hour of margin for a
    clock stepped back), and the rest are the few rows not yet published (or dead). PostgreSQL
    then ORs the two partial indexes for a short window and still scans for a long one.
    """
    table = qualified(source.schema, OUTBOX_MESSAGES).as_string(None)
    query = TEMPLATES.read_outbox.format(table=sql.SQL(table)).as_string(None)
    preds = [_outbox_predicate(a, b) for a, b in _ranges(lo, hi, partitions)]
    return _jdbc(spark, source, query, preds, table=table)


def read_inbox(
    spark: SparkSession,
    source: Source,
    lo: dt.datetime,
    hi: dt.datetime,
    partitions: int,
    *,
    until: dt.datetime | None = None,
    margin: dt.timedelta = _CLOCK_MARGIN,
) -> DataFrame:
    """Inbox rows with ``lo - margin <= received_at < until`` (default ``hi``), tagged with the
    source.

    ``[lo - margin, hi)`` is split into ``partitions`` ranges and the last one runs on to
    ``until``: the job reads the rows of a window (``hi`` its end) plus the few deliveries after
    it up to the inbox's safe time, so the split follows the window. Split up to ``until``
    (often days later), every row would land in the first range: one partition doing all the
    work.

    The margin (the outbox read's hour, for a clock stepped back) is for clock skew: ``lo`` is
    a time on the outbox server's clock, ``received_at`` one on the inbox server's. With the
    inbox clock 1 s behind, a message created 0.5 s after the window start is received "0.5 s
    before" it; read from ``lo`` exactly, its delivery is missed and the message reported lost.
    Rows read in the margin only ever complete a pair: ``reconcile_rows`` takes phantom
    candidates from ``[start, end)`` alone.
    """
    from pyspark.sql import functions as F

    table = qualified(source.schema, INBOX_MESSAGES).as_string(None)
    query = TEMPLATES.read_inbox.format(table=sql.SQL(table)).as_string(None)
    preds = time_predicates("received_at", _inbox_start(lo, margin), hi, partitions, until=until)
    df = _jdbc(spark, source, query, preds, table=table)
    return df.withColumn("source", F.lit(source.name))
