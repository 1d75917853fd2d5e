"""tools/api_reference.py's checks: a public name without an entry or a docstring, and a link
that leads nowhere, fail the build (CI builds the reference itself: .ci/run)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "api_reference.py"


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("api_reference", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def _page(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<html><body>{body}</body></html>")


def test_a_link_to_no_page_or_no_anchor_is_broken(tool: types.ModuleType, tmp_path: Path) -> None:
    _page(
        tmp_path / "pkg.html",
        '<a href="pkg/sub.html#f">f</a> <a href="#Gone">x</a> <a href="https://example.org/">'
        'away</a> <span id="Here"></span> <a href="#Here">h</a>',
    )
    _page(
        tmp_path / "pkg" / "sub.html", '<a href="../pkg.html#Here">up</a> <a href="nope.html">n</a>'
    )
    assert tool.broken_links(tmp_path) == [
        "pkg.html: #Gone (no such anchor)",
        "pkg.html: pkg/sub.html#f (no such anchor)",
        "pkg/sub.html: nope.html (no such page)",
    ]


def test_a_public_name_without_an_entry_or_a_docstring_fails(
    tool: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("fakepkg")

    def documented() -> None:
        """Says what it does."""

    def bare() -> None:
        pass

    fake.documented, fake.bare, fake.__all__ = documented, bare, ["documented", "bare", "lost"]
    fake.lost = documented
    monkeypatch.setitem(sys.modules, "fakepkg", fake)
    monkeypatch.setattr(tool, "MODULES", ("fakepkg",))
    _page(tmp_path / "fakepkg.html", '<div id="documented"></div><div id="bare"></div>')
    assert tool.missing_entries(tmp_path) == [
        "fakepkg.bare: no docstring",
        "fakepkg.lost: no entry on fakepkg.html",
    ]
