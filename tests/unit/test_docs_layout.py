"""The documentation's shape: four kinds of page, one page of figures, defined failure-mode ids.

* Every page under docs/ sits in tutorial/, how-to/, reference/ or explanation/ (docs/README.md,
  the index, and docs/images/ excepted).
* README.md stays a newcomer's page: at most 160 lines.
* Figures live on one page: no other page names a results file or quotes a rate.
* Every relative link of the docs and the README reaches a file, and an anchor a heading of it.
* A comment or docstring in the packages that cites a failure-mode id (F15, F32, ...) cites one
  that docs/explanation/failure-modes.md defines, and every test that page names exists.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
KINDS = ("tutorial", "how-to", "reference", "explanation")
PACKAGES = ("outbox", "inbox", "relay", "spark_ingest", "outbox_console", "migrations")
FAILURE_MODES = DOCS / "explanation" / "failure-modes.md"
PERFORMANCE = DOCS / "explanation" / "performance.md"
README_MAX_LINES = 160
FAILURE_ID = re.compile(r"\bF(\d{1,2})\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _defined_failure_modes() -> set[int]:
    return {int(n) for n in re.findall(r"^\*\*F(\d+)\.", FAILURE_MODES.read_text(), re.MULTILINE)}


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    source = path.read_text()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


def test_every_page_sits_in_one_of_the_four_kinds() -> None:
    outside = [
        str(page.relative_to(DOCS))
        for page in DOCS.rglob("*")
        if page.is_file()
        and page != DOCS / "README.md"
        and page.relative_to(DOCS).parts[0] not in (*KINDS, "images")
    ]
    assert outside == [], f"pages outside {', '.join(KINDS)}: {outside}"


def test_the_index_names_the_four_kinds() -> None:
    index = (DOCS / "README.md").read_text()
    for kind in KINDS:
        assert f"`{kind}/`" in index, f"docs/README.md does not name {kind}/"


def test_the_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *_pages()], ids=lambda p: p.name)
def test_figures_are_only_on_the_performance_page(page: Path) -> None:
    if page == PERFORMANCE:
        return
    text = page.read_text()
    for mark in ("bench/results/", "msg/s", "tx/s"):
        assert mark not in text, (
            f"{page.relative_to(ROOT)} quotes a figure ({mark!r}): "
            f"move it to {PERFORMANCE.relative_to(ROOT)}"
        )


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


@pytest.mark.parametrize("page", [ROOT / "README.md", *_pages()], ids=lambda p: p.name)
def test_relative_links_reach_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and resolved.suffix == ".md"
        if not resolved.exists() or (missing_anchor and anchor not in _anchors(resolved)):
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)}: broken links {broken}"


def test_the_failure_modes_page_defines_ids() -> None:
    assert len(_defined_failure_modes()) >= 10


def test_the_tests_the_failure_modes_page_names_exist() -> None:
    missing = []
    for path, name in re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", FAILURE_MODES.read_text()):
        test_file = ROOT / path
        if not test_file.is_file():
            missing.append(path)
        elif name and not re.search(rf"def {name}\(", test_file.read_text()):
            missing.append(f"{path}::{name}")
    assert missing == []


@pytest.mark.parametrize("package", PACKAGES)
def test_comments_cite_only_defined_failure_modes(package: str) -> None:
    defined = _defined_failure_modes()
    undefined = [
        f"{path.relative_to(ROOT)}:{line}: F{number}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, text in _comments_and_docstrings(path)
        for number in map(int, FAILURE_ID.findall(text))
        if number not in defined
    ]
    assert undefined == [], (
        "failure-mode ids not defined in docs/explanation/failure-modes.md: " + ", ".join(undefined)
    )
