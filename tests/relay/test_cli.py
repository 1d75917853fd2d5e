"""The relay's command line as a user runs it: separate processes, real exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


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


@pytest.mark.parametrize(
    "argv",
    [(OUTBOX, "relay"), (sys.executable, "-m", "relay")],
    ids=["outbox relay", "python -m relay"],
)
def test_cli_relay_without_the_tables_fails_with_one_clear_line(
    empty_database_url: str, argv: tuple[str, ...]
) -> None:
    # It used to retry "relation does not exist" forever (the subprocess timed out here).
    done = _run(*argv, "--url", empty_database_url, "--broker", "memory:", timeout=30)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the outbox-inbox tables")
    assert "outbox migrate upgrade" in last


def test_cli_relay_bad_setting_is_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text('database_url = "postgresql://nowhere/db"\nmetrics_port = 70000\n')
    done = _run(OUTBOX, "relay", "--config", str(cfg), "--broker", "memory:")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: metrics_port must be a TCP port, an integer from 1 to 65535, got 70000"
    ]
