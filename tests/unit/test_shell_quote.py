"""Suggested commands are safe to paste: run as printed in bash, each runs the intended
command with exactly the intended arguments and nothing else, whatever the key, topic,
consumer name or URL holds (outbox/_shell.py; ``outbox trace`` text, ``--json`` and the
console's journey page all print the commands ``_actions`` makes)."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from outbox._shell import shell_line, shell_quote
from outbox.trace import InboxRecord, OutboxRecord, TraceSource, TraceSources
from outbox.trace._advice import _actions

HOSTILE = [
    "k;touch${IFS}PWNED;#",
    "k$(touch PWNED)",
    "k`touch PWNED`",
    "k' ; touch PWNED ; '",
    'k" ; touch PWNED ; "',
    "k\ntouch PWNED",
    "k\r\ntouch PWNED",
    "k\x1b]0;owned\x07",  # a terminal title escape
    "k\u202etxt.exe",  # a right-to-left override
    "k\u2066isolate\u2069",
    "k\\x41\\'",
    "k > PWNED",
    "k & touch PWNED &",
    "k|touch PWNED",
    "~root",
    "-rf",
    "*",
    "$HOME",
    "!!",
    "ключ €",
    "",
]

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _visible(line: str) -> bool:
    """No raw control, format (bidi) or other unprintable character."""
    import unicodedata

    return all(ch.isprintable() and unicodedata.category(ch) != "Cf" for ch in line)


def _run(line: str, tmp_path: Path) -> list[list[str]]:
    """Run ``line`` in bash with ``outbox`` and ``echo`` recording their arguments; every
    command run, as the argument lists it got. Nothing else may appear in ``tmp_path``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = tmp_path / "calls"
    for name in ("outbox", "echo"):
        tool = bin_dir / name
        # each call: its argument count, its name, its arguments, NUL-terminated
        tool.write_text(
            f'#!/bin/bash\nprintf \'%s\\0\' "$#" "${{0##*/}}" "$@" >> {shlex.quote(str(calls))}\n'
        )
        tool.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "LC_ALL": "C"}
    # `enable -n echo`: the builtin would not be recorded
    subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", "enable -n echo\n" + line],
        cwd=work,
        env=env,
        check=True,
        timeout=20,
    )
    made = sorted(p.name for p in work.iterdir())
    assert made in ([], ["ids.txt"]), f"the line created {made}"
    assert not (tmp_path / "PWNED").exists()
    items = calls.read_bytes().decode().split("\0")[:-1] if calls.exists() else []
    out = []
    while items:
        n = int(items[0])
        out.append(items[1 : n + 2])
        items = items[n + 2 :]
    return out


@needs_bash
@pytest.mark.parametrize("arg", HOSTILE)
def test_a_quoted_argument_is_read_back_exactly(arg: str, tmp_path: Path) -> None:
    line = shell_line(["outbox", "trace", "--key", arg])
    assert _visible(line)
    assert _run(line, tmp_path) == [["outbox", "trace", "--key", arg]]


def test_plain_arguments_stay_readable() -> None:
    assert shell_quote("order-17") == "order-17"
    assert shell_quote("a b") == shlex.quote("a b") == "'a b'"
    assert shell_quote("k\x1b") == "$'k\\x1b'"


def _now() -> dt.datetime:
    return dt.datetime(2026, 11, 28, tzinfo=dt.UTC)


def _commands(key: str, consumer: str, url: str) -> list[str]:
    """Every command ``outbox trace`` suggests for a message of ``key``, dead at the relay,
    dead and holding at ``consumer``, waiting behind seq 1 at another consumer."""
    mid = uuid.UUID(int=7)
    held_by = uuid.UUID(int=5)
    record = OutboxRecord(
        status="dead",
        attempts=3,
        last_error="boom",
        created_at=_now(),
        available_at=_now(),
        published_at=None,
        leased_by=None,
        lease_until=None,
        content_type="application/json",
        headers={},
        payload_bytes=2,
    )
    published = OutboxRecord(**{**record.__dict__, "status": "published", "published_at": _now()})
    records = [
        InboxRecord("in1", consumer, "dead", attempts=2, held=True),
        InboxRecord("in1", consumer, "parked", held_by=held_by, held_by_seq=1),
        InboxRecord("in1", consumer, "absent", key_applied_seq=1),
        InboxRecord("in1", consumer, "absent"),
    ]
    sources = TraceSources(
        TraceSource("outbox", url, schema=None), (TraceSource("in1", url, schema=None),)
    )
    out = []
    for rec in (record, published):
        actions, _ = _actions(mid, "orders", key, 5, rec, records, None, [], sources)
        out.extend(a.command for a in actions if a.command)
    return list(dict.fromkeys(out))  # the consumers' commands come twice


@needs_bash
@pytest.mark.parametrize("hostile", HOSTILE[:12])
def test_every_suggested_command_runs_as_printed(hostile: str, tmp_path: Path) -> None:
    url = "postgresql://app@db/x?application_name=" + hostile.replace("\n", "")
    commands = _commands(key=hostile, consumer=f"c{hostile}", url=url)
    assert len(commands) == 5
    mid, held = str(uuid.UUID(int=7)), str(uuid.UUID(int=5))
    for line in commands:
        assert _visible(line), line
    ran = [_run(line, tmp_path / str(i)) for i, line in enumerate(commands)]
    flags = ["--url", url]
    assert ran == [
        [["outbox", "dead", "retry", "--id", mid, "--reason", "...", *flags]],
        [["outbox", "inbox", "dead", "retry", "--consumer", f"c{hostile}", "--id", mid,
          "--reason", "...", *flags]],
        [["outbox", "inbox", "dead", "retry", "--consumer", f"c{hostile}", "--id", held,
          "--reason", "...", *flags]],
        [["outbox", "trace", "--topic", "orders", "--key", hostile, "--seq", "2", *flags]],
        [["echo", mid], ["outbox", "redrive", "ids.txt", "--reason", "...", *flags]],
    ]  # fmt: skip
