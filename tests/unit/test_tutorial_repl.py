"""The tutorial says to run its blocks in a ``python`` prompt: each block, fed line by line as
the prompt reads it, must compile (a statement right after an indented block, with no blank
line between, is a SyntaxError there, though fine in a file)."""

from __future__ import annotations

import codeop
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorial" / "first-message.md"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _prompt_errors(code: str) -> list[str]:
    """What the interactive prompt refuses of ``code`` pasted into it."""
    compile_line = codeop.CommandCompiler()
    pending: list[str] = []
    errors = []
    for number, line in enumerate([*code.splitlines(), ""], 1):
        pending.append(line)
        try:
            done = compile_line("\n".join(pending), "<stdin>", "single")
        except SyntaxError as exc:
            errors.append(f"line {number} {line!r}: {exc.msg}")
            pending = []
            continue
        if done is not None:
            pending = []
    return errors


def test_the_checker_finds_what_the_prompt_refuses() -> None:
    assert _prompt_errors("with open('x') as f:\n    pass\nprint(1)\n") != []
    assert _prompt_errors("with open('x') as f:\n    pass\n\nprint(1)\n") == []


@pytest.mark.parametrize("index", range(len(FENCE.findall(PAGE.read_text()))))
def test_each_tutorial_block_pastes_into_a_python_prompt(index: int) -> None:
    block = FENCE.findall(PAGE.read_text())[index]
    assert _prompt_errors(block) == []
