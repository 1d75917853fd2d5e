"""Operator commands on a database that cannot be used print one line and exit 2 (never a
traceback); listings put one item on one line and have --json; a missing optional extra is
named with the pip command to run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.relay.relay_helpers import write

OUTBOX = [sys.executable, "-m", "outbox.cli"]


def _outbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OUTBOX, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["status", "--url", "postgresql://postgres@127.0.0.1:1/x"], "cannot reach the database"),
        (
            ["dead", "list", "--url", "postgresql://postgres@127.0.0.1:5432/no_such_db_x"],
            "check the database name in --url",
        ),
        (["inbox", "held", "--url", "postgresql://postgres@127.0.0.1:1/x"], "cannot reach"),
    ],
)
def test_an_unusable_database_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    done = _outbox(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert says in line


def test_unmigrated_database_says_what_to_run(empty_database_url: str) -> None:
    done = _outbox("dead", "list", "--url", empty_database_url)
    assert done.returncode == 2
    assert "outbox migrate upgrade" in done.stderr
    assert "Traceback" not in done.stderr


def test_dead_list_is_one_line_per_message_and_json(url: str) -> None:
    [msg_id] = write(url, [("orders", "k\tone")])
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE outbox_messages SET status = 'dead', last_error = %s WHERE id = %s",
            ("line one\nline two", msg_id),
        )
        conn.commit()
    listed = _outbox("dead", "list", "--url", url)
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    assert "k\\tone" in line
    assert line.endswith("line one\\nline two")
    [doc] = json.loads(_outbox("dead", "list", "--url", url, "--json").stdout)
    assert (doc["id"], doc["key"], doc["last_error"]) == (
        str(msg_id),
        "k\tone",
        "line one\nline two",
    )
    assert json.loads(_outbox("dead", "audit", "--url", url, "--json").stdout) == []


def test_a_missing_extra_is_named(tmp_path: Path) -> None:
    # sitecustomize hides pyspark, as on an install without the spark extra
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['pyspark'] = None\n")
    done = subprocess.run(
        [*OUTBOX, "reconcile", "--outbox", "jdbc:postgresql://127.0.0.1:5432/a",
         "--inbox", "jdbc:postgresql://127.0.0.1:5432/b", "--no-record"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "pip install 'outbox-inbox[spark]'" in done.stderr
