"""The sync modules generated from their async sources are current: what
``tools/async_to_sync.py`` generates now is what the repository holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_sync_modules_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "async_to_sync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_generated_modules_say_so_in_their_first_line() -> None:
    for target in ("inbox/_receive_sync.py", "inbox/_runner_sync.py", "outbox/_publish_sync.py"):
        first = (ROOT / target).read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# This file is generated from "), target
        assert first.endswith("by tools/async_to_sync.py: do not edit it."), target
