"""Who consumes which partition of a partitioned consumer (``outbox inbox partitions``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from inbox._receive import translate
from inbox._retention import _libpq_url
from inbox._statements import inbox_statements

__all__ = ["PartitionLease", "partition_leases"]


@dataclass(frozen=True)
class PartitionLease:
    """One partition of a partitioned consumer: its owner (None: free), the owner's epoch,
    how long its lease still holds, and whether it is held now."""

    consumer: str
    partition: int
    owner: str | None
    epoch: int
    expires_in: dt.timedelta | None
    held: bool | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def partition_leases(
    url: str, *, consumer: str | None = None, schema: str | None = None
) -> list[PartitionLease]:
    """Every partition lease (of ``consumer``, or of every partitioned consumer), in order."""
    stmts = inbox_statements(schema)
    try:
        with (
            psycopg.connect(_libpq_url(url), autocommit=True) as conn,
            conn.cursor(row_factory=class_row(PartitionLease)) as cur,
        ):
            return cur.execute(stmts.partition_status, {"consumer": consumer}).fetchall()
    except psycopg.Error as exc:
        raise translate(exc, stmts) from exc
