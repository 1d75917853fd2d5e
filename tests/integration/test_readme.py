"""The README's Python examples run, as written, against a fresh database.

A block that runs until it is stopped (the consumer's ``await consumer.run()``) is only
compiled here: tests/install/test_readme.py runs it, from the wheel, beside the README's relay
and a fresh nats-server, through to the row it writes."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from outbox._migrate import sqlalchemy_url

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
#: blocks that serve until stopped (tests/install/test_readme.py runs them end to end)
SERVES = re.compile(r"await \w+\.run\(\)")
#: Fences that would hold Python this test does not run.
OTHER_PYTHON_FENCES = re.compile(r"^```(py|python3|pycon)\s*$", flags=re.MULTILINE)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 1
    assert any(not SERVES.search(b) for b in BLOCKS)  # at least one runs here


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
    code = compile(BLOCKS[index], f"README.md[python block {index}]", "exec")
    if SERVES.search(BLOCKS[index]):
        return  # compiled; run end to end by tests/install/test_readme.py
    exec(code, module.__dict__)
    engine = module.__dict__.get("engine")
    if engine is not None:
        engine.dispose()
