"""Every code example in docs/ runs as written, against a fresh migrated database.

Per document, its ```python blocks run in order in one namespace (a tutorial builds on its
earlier steps) with DATABASE_URL (SQLAlchemy form) and OUTBOX_DATABASE_URL (libpq form) set to
that database, and its ```sql blocks run in order on one autocommit connection (the database
is dropped afterwards). Python under any other fence would be an example nobody runs, so it
fails; every document is reachable from docs/README.md.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import psycopg
import pytest

from outbox._migrate import sqlalchemy_url

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md"))


def _blocks(page: Path, language: str) -> list[str]:
    # a fence may name the file a reader saves the block as: ```python file=app.py
    fence = re.compile(
        rf"^```{language}(?:[ \t][^\n]*)?\n(.*?)^```", flags=re.DOTALL | re.MULTILINE
    )
    return fence.findall(page.read_text())


def _name(page: Path) -> str:
    return str(page.relative_to(DOCS))


WITH_PYTHON = [p for p in PAGES if _blocks(p, "python")]
WITH_SQL = [p for p in PAGES if _blocks(p, "sql")]


def test_docs_have_runnable_examples() -> None:
    assert len(WITH_PYTHON) >= 3


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_python_is_fenced_python(page: Path) -> None:
    other = re.compile(r"^```(py|python3|pycon)\s*$", flags=re.MULTILINE)
    assert other.findall(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_page_is_linked_from_the_index(page: Path) -> None:
    if page.name == "README.md" and page.parent == DOCS:
        return
    index = (DOCS / "README.md").read_text()
    assert f"({_name(page)})" in index, f"docs/README.md does not link {_name(page)}"


@pytest.mark.parametrize("page", WITH_PYTHON, ids=_name)
def test_python_examples_run(
    page: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url).render_as_string(False))
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    module = types.ModuleType(f"doc_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for index, block in enumerate(_blocks(page, "python")):
        code = compile(block, f"docs/{_name(page)}[python block {index}]", "exec")
        exec(code, module.__dict__)
    engine = module.__dict__.get("engine")
    if engine is not None:
        engine.dispose()


@pytest.mark.parametrize("page", WITH_SQL, ids=_name)
def test_sql_examples_run(page: Path, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for block in _blocks(page, "sql"):
            conn.execute(block.encode())


def test_generated_reference_pages_are_current() -> None:
    spec = importlib.util.spec_from_file_location(
        "ci_reference", DOCS.parent / ".ci" / "reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    for name, render in reference.PAGES.items():
        current = (DOCS / "reference" / name).read_text()
        assert current == render(), (
            f"docs/reference/{name} is stale: run .venv/bin/python .ci/reference.py"
        )
