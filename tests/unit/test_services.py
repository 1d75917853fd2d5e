"""A missing service skips a test locally and fails it under CI, naming the service and what
to do (tests/support/services.py), so a CI run with a broker down cannot pass by testing nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
from tests.support.services import require_port

def test_needs_a_broker():
    require_port(1, "Widget broker", "start it with `widgetd --port 1`")
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "OUTBOX_REQUIRE_SERVICES")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(probe)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        timeout=120,
    )


def test_missing_service_skips_locally(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    assert "Widget broker is not available: start it with `widgetd --port 1`" in done.stdout


@pytest.mark.parametrize("env", [{"CI": "true"}, {"OUTBOX_REQUIRE_SERVICES": "1"}])
def test_missing_service_fails_under_ci(tmp_path: Path, env: dict[str, str]) -> None:
    done = _run(tmp_path, **env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout
    assert "Widget broker is not available: start it with `widgetd --port 1`" in done.stdout
    assert "This run requires every service" in done.stdout
