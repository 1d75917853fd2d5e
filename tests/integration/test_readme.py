"""The README's Python examples run, as written, against a fresh database."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from outbox._migrate import sqlalchemy_url

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
#: Fences that would hold Python this test does not run.
OTHER_PYTHON_FENCES = re.compile(r"^```(py|python3|pycon)\s*$", flags=re.MULTILINE)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 1


def test_readme_python_is_fenced_python() -> None:
    # Only ```python blocks run; any other Python fence would be an example nobody runs.
    assert OTHER_PYTHON_FENCES.findall(README.read_text()) == []


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(
    database_url: str, monkeypatch: pytest.MonkeyPatch, index: int
) -> None:
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url).render_as_string(False))
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    module = types.ModuleType(f"readme_example_{index}")  # ORM annotations need a real module
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), module.__dict__)
    engine = module.__dict__.get("engine")
    if engine is not None:
        engine.dispose()
