"""Every status the library's SQL writes or compares is one the schema documents.

``outbox_messages`` and ``inbox_messages`` have no CHECK constraint on ``status`` (outbox_0013:
PostgreSQL plans a table's checks again for every statement that writes it). Only the
library's statements write these tables, with the statuses as constants in their text, so
this test reads those texts and holds every status literal to the schema's
MESSAGE_STATUSES: a typo in a statement fails here instead of leaving a row no reader knows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from outbox.schema import INBOX_MESSAGES, MESSAGE_STATUSES, OUTBOX_MESSAGES

REPO = Path(__file__).resolve().parents[2]
OUTBOX_STATUSES = MESSAGE_STATUSES[OUTBOX_MESSAGES]
INBOX_STATUSES = MESSAGE_STATUSES[INBOX_MESSAGES]

_LITERAL = re.compile(r"'([^']*)'")
# status = 'x', status <> 'x', m.status || '' = 'x' (the form that keeps an index unused)
_COMPARED = re.compile(r"\bstatus\b(?:\s*\|\|\s*'')?\s*(?:=|<>|!=)\s*'([^']*)'", re.I)
# status IN ('x', 'y'), status NOT IN (...)
_IN_LIST = re.compile(r"\bstatus\b\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", re.I)
# SET status = CASE ... END: the results after THEN and ELSE
_CASE = re.compile(r"\bstatus\b\s*=\s*CASE\b(.*?)\bEND\b", re.I | re.S)
_RESULT = re.compile(r"\b(?:THEN|ELSE)\s+'([^']*)'", re.I)
# INSERT INTO t (..., status, ...) VALUES (..., 'x', ...): the value in status's position
_INSERT = re.compile(r"\(([^()]*\bstatus\b[^()]*)\)\s*VALUES\s*\(", re.I)


def _split_top(text: str) -> list[str]:
    """``text`` split on the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return [*parts, text[start:i]]
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def status_literals(sql: str) -> set[str]:
    """The status values ``sql`` compares with or writes, as far as they are literals."""
    found = set(_COMPARED.findall(sql))
    for listed in _IN_LIST.findall(sql):
        found |= set(_LITERAL.findall(listed))
    for case in _CASE.findall(sql):
        found |= set(_RESULT.findall(case))
    for match in _INSERT.finditer(sql):
        columns = [c.strip().lower() for c in match.group(1).split(",")]
        values = _split_top(sql[match.end() :])
        if len(values) >= len(columns):
            value = values[columns.index("status")].strip()
            found |= set(re.fullmatch(r"'([^']*)'", value).groups() if value[:1] == "'" else ())
    return found


def test_the_reader_finds_a_misspelt_status_in_each_form() -> None:
    sql = """
    UPDATE t SET status = 'publishd' WHERE m.status || '' = 'pendng' AND status <> 'dead';
    SELECT 1 WHERE status IN ('stale', 'staled');
    UPDATE t SET status = CASE WHEN x THEN 'deadd' ELSE 'processing' END;
    INSERT INTO t (consumer, seq, status, attempts) VALUES (%(c)s, coalesce(1, 2), 'procesed', 1)
    """
    assert status_literals(sql) == {
        "publishd", "pendng", "dead", "stale", "staled", "deadd", "processing", "procesed",
    }  # fmt: skip


def _sources(package: str) -> list[Path]:
    """The package's SQL files and its Python (the statements not moved to a .sql file yet)."""
    return sorted([*(REPO / package).glob("*.py"), *(REPO / package).glob("*.sql")])


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("outbox", OUTBOX_STATUSES | INBOX_STATUSES),  # its CLI also reports the inbox
        ("relay", OUTBOX_STATUSES),
        ("inbox", INBOX_STATUSES),
        ("outbox_console", OUTBOX_STATUSES | INBOX_STATUSES),
        ("spark_ingest", OUTBOX_STATUSES | INBOX_STATUSES),
        ("migrations/versions", OUTBOX_STATUSES | INBOX_STATUSES),
    ],
)
def test_every_status_in_the_sql_is_documented(package: str, allowed: frozenset[str]) -> None:
    seen: dict[str, set[str]] = {}
    for path in _sources(package):
        for status in status_literals(path.read_text()):
            seen.setdefault(status, set()).add(path.name)
    unknown = {s: sorted(files) for s, files in seen.items() if s not in allowed}
    assert unknown == {}, f"statuses not in the schema's sets: {unknown}"
    if package in ("relay", "inbox"):
        # the reader sees the statements that write the statuses (not vacuously green)
        assert len(seen) >= 3, seen
