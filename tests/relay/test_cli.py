"""The relay's command line as a user runs it: separate processes, real exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.parametrize(
    "argv",
    [
        (sys.executable, "-m", "relay", "--help"),
        (sys.executable, "-m", "relay", "status", "--help"),
        (OUTBOX, "relay", "--help"),
        (OUTBOX, "dead", "--help"),
    ],
    ids=["python -m relay", "python -m relay status", "outbox relay", "outbox dead"],
)
def test_cli_help_runs(argv: tuple[str, ...]) -> None:
    done = _run(*argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage:")
    assert "Traceback" not in done.stderr
