"""Building the package prints no setuptools warning (``bash .ci/demo`` used to print ~140
lines of ``BuildBackendWarning`` about data folders missing from the packages list around its
five lines of result)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_building_the_wheel_warns_about_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in (done.stdout + done.stderr).splitlines()
                if "BuildBackendWarning" in line or "Package would be ignored" in line]  # fmt: skip
    assert warnings == []
