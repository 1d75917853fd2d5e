"""Rows are read by name (``dict_row``, ``class_row``/``kwargs_row`` into a dataclass,
``outbox.kit.rows_by_name`` for the cursors that give tuples, and for the rows ``run_steps``
sends into the inbox's statement generators), whatever the variables are called:
``tests/support/rows.py`` follows a row from the cursor through names, loops, comprehensions,
returns and parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.rows import package_sources, positional_reads

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("outbox", "inbox", "relay", "spark_ingest", "outbox_console")
#: files left as they are, with why; each entry is a debt, not a rule
LEFT = {
    # The claim's rows: ten columns per claimed message, unpacked in the loop that builds the
    # envelopes, once per claimed message; the marks' ids (one column) on the session's own
    # cursor.
    "relay/_claim.py": "the claim's hot loop and the marks' ids",
    # The write path's cursors may be asyncpg's (outbox/_asyncpg.py), which give tuples: each
    # read here is of the write path's own one-statement results, per message.
    "outbox/_publish_common.py": "the write path's insert result",
    "outbox/_publish_async.py": "the write path's capture-mode read",
    "outbox/_publish_sync.py": "the write path's capture-mode read (generated)",
}


def test_no_column_is_read_by_position() -> None:
    found = positional_reads(package_sources(ROOT, PACKAGES))
    assert [f for f in found if f.split(":", 1)[0] not in LEFT] == []


def _find(source: str) -> list[str]:
    return [f.split(": ", 1)[1] for f in positional_reads([("m.py", source)])]


@pytest.mark.parametrize(
    ("source", "found"),
    [
        # the cases, under names the old check (row/r only) did not look at
        ("ident = cur.fetchone()\nx = ident[3]\n", ["ident[3]"]),
        (
            "def envelope(held):\n    return held[:9]\n"
            "def f(conn):\n    for h in conn.execute(q).fetchall():\n        envelope(h)\n",
            ["held[:9]"],
        ),
        ("rows = cur.fetchall()\nx = rows[0][4]\n", ["rows[0][4]"]),
        ("a, b, c = cur.fetchone()\n", ["a, b, c = cur.fetchone()"]),
        ("for oid, name in conn.execute(q):\n    pass\n", ["for (oid, name) in ..."]),
        ("x = {t: n for t, n in cur.fetchall()}\n", ["for (t, n) in ..."]),
        ("with conn.cursor() as c:\n    v = c.fetchone()[0]\n", ["c.fetchone()[0]"]),
        (
            "async def f(raw):\n    got = await (await raw.execute(q)).fetchall()\n"
            "    return [Held(*v) for v in got]\n",
            ["*v (spread by position)"],
        ),
        (
            "found = dict(conn.execute(q).fetchall())\n",
            ["dict(conn.execute(q).fetchall()) (pairs by position)"],
        ),
        (
            "def _run(conn):\n    return conn.execute(q).fetchall()\n"
            "ids = [x[0] for x in _run(c)]\n",
            ["x[0]"],
        ),
        # a statement generator's step: run_steps sends the row back (through a parameter too)
        (
            "def decide(position):\n    return position[0]\n"
            "def steps(stmts):\n    pos = yield stmts.lock, {}\n    held = pos[1]\n"
            "    return decide(pos)\n",
            ["pos[1]", "position[0]"],
        ),
        # read by name: nothing to find
        ("row = cur.fetchone()\nx = row['topic']\n", []),
        ("for r in cur.fetchall():\n    print(r.topic, r['key'])\n", []),
        ("parts = url.partition(':')[2]\nrow = parts[0]\n", []),
    ],
)
def test_the_finder_follows_a_row_whatever_it_is_called(source: str, found: list[str]) -> None:
    assert sorted(_find(source)) == sorted(found)
