"""What a user installs: the built wheel, in clean virtualenvs, one per install line of the docs.

``.ci/run`` builds the sdist and the wheel (``python -m build``: the wheel is built from the
sdist, so both are checked) into ``dist/`` and points ``OUTBOX_DIST`` at it; run alone, these
tests build them into a temporary folder. Each virtualenv has the wheel with only the extras a
page names, and nothing from this checkout: the tests run in a folder outside the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Env:
    """A clean virtualenv holding the wheel with ``extras``."""

    path: Path
    extras: str
    dist: Path

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def environ(self, **extra: str) -> dict[str, str]:
        """The environment of a shell that activated this virtualenv, outside the checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.path)
        # `pip install 'outbox-inbox[...]'`, as the pages write it, finds the wheel built here
        links = [str(self.dist), *(p for p in ("/opt/wheels",) if Path(p).is_dir())]
        env["PIP_FIND_LINKS"] = " ".join(links)
        env.update(extra)
        return env

    def run(
        self, args: list[str], cwd: Path, timeout: float = 300, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            cwd=cwd,
            env=self.environ(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("OUTBOX_DIST")
    if given:
        return Path(given).resolve()
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("outbox_inbox-*.whl")
    return found


@pytest.fixture(scope="session")
def sdist(dist: Path) -> Path:
    (found,) = dist.glob("outbox_inbox-*.tar.gz")
    return found


@pytest.fixture(scope="session")
def installed(
    tmp_path_factory: pytest.TempPathFactory, wheel: Path, dist: Path
) -> Callable[[str], Env]:
    """``installed("nats")``: a virtualenv with ``pip install <wheel>[nats]`` (made once)."""
    made: dict[str, Env] = {}
    root = tmp_path_factory.mktemp("venvs")

    def get(extras: str) -> Env:
        if extras not in made:
            path = root / (extras.replace(",", "-") or "no-extras")
            venv.create(path, with_pip=True)
            env = Env(path, extras, dist)
            target = f"{wheel}[{extras}]" if extras else str(wheel)
            done = env.run([str(env.python), "-m", "pip", "install", "-q", target], cwd=root)
            assert done.returncode == 0, f"pip install {target} failed:\n{done.stderr[-3000:]}"
            made[extras] = env
        return made[extras]

    return get


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder: not the repository, so nothing is imported from the checkout."""
    folder = tmp_path / "project"
    folder.mkdir()
    return folder
