"""No function in the packages is longer than 80 lines: a long function is split into parts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("outbox", "inbox", "relay", "spark_ingest", "outbox_console", "migrations")
MAX_LINES = 80

def long_functions(path: Path) -> list[str]:
    """``name:line (n lines)`` of every function in ``path`` longer than MAX_LINES."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                found.append(f"{node.name}:{node.lineno} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    too_long = {
        rel: found
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (found := long_functions(path))
        for rel in [path.relative_to(ROOT).as_posix()]
    }
    assert not too_long, f"split these functions (at most {MAX_LINES} lines each): {too_long}"


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\ndef short():\n    pass\n")
    assert long_functions(tmp_path / "long.py") == [f"long:1 ({MAX_LINES + 1} lines)"]
