"""The public API's types tell a user's mypy about a wrong connection or a missing argument."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]

_GOOD = """
import psycopg
from sqlalchemy.orm import Session
from outbox import publish
from inbox import receive

def ok(session: Session, conn: psycopg.Connection[tuple[object, ...]], msg: object) -> None:
    publish(session, topic="orders", key="1", payload={})
    publish(conn, topic="orders", key="1", payload={})
    receive(session, consumer="billing", message=msg)
"""

_BAD = """
import sqlite3
from sqlalchemy.ext.asyncio import AsyncSession
from outbox import publish, publish_async
from inbox import receive

async def wrong(db: sqlite3.Connection, session: AsyncSession, msg: object) -> None:
    publish(db, topic="orders", key="1", payload={})          # not PostgreSQL
    publish(session, topic="orders", key="1", payload={})     # async session, sync call
    await publish_async(db, topic="orders", key="1", payload={})
    receive("postgresql://", consumer="billing", message=msg)  # a URL is not a transaction
"""


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(source))
    out, err, status = mypy_api.run(
        ["--strict", "--no-incremental", "--config-file", "/dev/null", str(snippet)]
    )
    return out + err, status


def test_mypy_accepts_sessions_and_psycopg_connections(tmp_path: Path) -> None:
    out, status = _mypy(tmp_path, _GOOD)
    assert status == 0, out


def test_mypy_reports_each_wrong_target(tmp_path: Path) -> None:
    out, status = _mypy(tmp_path, _BAD)
    assert status == 1, out
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert flagged == {8, 9, 10, 11}, out
    assert 'Argument 1 to "publish" has incompatible type' in out


_HANDLERS_GOOD = """
from typing import Any
import psycopg
from sqlalchemy.orm import Session, sessionmaker
from psycopg_pool import ConnectionPool
from inbox import AsyncHandler, BatchHandler, Handler, TransactionSource
from outbox.envelope import Envelope

def apply(session: Session, envelope: Envelope) -> None: ...
async def apply_async(conn: psycopg.AsyncConnection[Any], envelope: Envelope) -> None: ...
def apply_all(conn: psycopg.Connection[Any], envelopes: list[Envelope]) -> int: return 0
def anything(target: object, message: object) -> None: ...

h: Handler[Session] = apply
a: AsyncHandler[psycopg.AsyncConnection[Any]] = apply_async
b: BatchHandler[psycopg.Connection[Any]] = apply_all
loose: Handler[Session] = anything

def sources(pool: ConnectionPool[Any], make: sessionmaker[Session]) -> list[TransactionSource]:
    return [pool, make, make.begin]
"""

_HANDLERS_BAD = """
from typing import Any
import psycopg
from sqlalchemy.orm import Session
from inbox import AsyncHandler, BatchHandler, Handler, TransactionSource
from outbox.envelope import Envelope

def apply(session: Session, envelope: Envelope) -> None: ...
async def apply_async(session: Session, envelope: Envelope) -> None: ...
def one_arg(envelope: Envelope) -> None: ...
def of_dicts(session: Session, message: dict[str, Any]) -> None: ...

h: Handler[psycopg.Connection[Any]] = apply           # a Session handler, psycopg target
a: AsyncHandler[Session] = apply                      # not a coroutine function
b: BatchHandler[Session] = apply                      # one envelope, not a list
o: Handler[Session] = one_arg                         # no target
d: Handler[Session] = of_dicts                        # not an Envelope
s: TransactionSource = "postgresql://"                # a URL opens no transaction
"""


def test_mypy_accepts_handlers_of_the_transactions_target(tmp_path: Path) -> None:
    out, status = _mypy(tmp_path, _HANDLERS_GOOD)
    assert status == 0, out


def test_mypy_reports_each_handler_that_does_not_fit(tmp_path: Path) -> None:
    out, status = _mypy(tmp_path, _HANDLERS_BAD)
    assert status == 1, out
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert flagged == {13, 14, 15, 16, 17, 18}, out
