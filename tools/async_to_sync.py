#!/usr/bin/env python3
"""Generate the sync modules of outbox-inbox from their async sources.

The code that exists in a sync and an async flavour (the handler runners, ``receive`` and
``record``, ``publish``) is written once, as async code, in ``<module>_async.py``; this script
writes ``<module>_sync.py`` from it. Each generated file says so in its first line: edit the
async source, then run ``python tools/async_to_sync.py``. ``--check`` writes nothing and exits
1 when a generated file is not what the source generates (CI runs it).

The rewrite is guided by the syntax tree of the source and applied to its text, so comments,
``# fmt: skip`` blocks and the layout survive:

* ``async def``, ``async with`` and ``async for`` lose ``async``; ``await x`` becomes ``x``
  (and ``(await x).y`` becomes ``x.y``);
* the names of :data:`NAMES` are renamed wherever they are code (names, attributes, imports,
  definitions) and, as whole words, in docstrings and comments;
* a statement whose first line carries the comment ``# async-only`` (a reason may follow) is
  left out of the sync module; when it is an ``if`` with an ``else``, the ``else`` block takes
  its place. Write the case that only exists for async code (asyncpg's connection) as that
  ``if``, and what both flavours do as its ``else``. Code that only the sync flavour needs has
  no place in the async source: give it a module of its own.

The result is passed through ``ruff`` (imports sorted, imports left unused removed, the
project's format), so the generated module is as clean as the source. The output depends on
ruff's version: the script refuses to run with any ruff but the one the ``test`` extra of
``pyproject.toml`` pins (``ruff==X.Y.Z``).

The script fails closed. A generated module in which a name still reads as async code
(``*_async``, ``async_*``, ``Async*``, ``asyncio``) is an error, not output: a name the map
misses would otherwise become a coroutine function called from sync code. So is an ``await``
of a name imported from another module that :data:`NAMES` does not rename: its sync twin,
if it has one, has another name, so the plain call would return a coroutine.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import textwrap
import tokenize
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: async source -> generated sync module, relative to the repository root
MODULES = {
    "inbox/_receive_async.py": "inbox/_receive_sync.py",
    "inbox/_runner_async.py": "inbox/_runner_sync.py",
    "outbox/_publish_async.py": "outbox/_publish_sync.py",
}

#: async name -> sync name. A dotted key ("asyncio.sleep") renames that attribute chain.
NAMES = {
    # the runners and their callables
    "AsyncHandlerRunner": "HandlerRunner",
    "AsyncHandler": "Handler",
    "AsyncAlso": "Also",
    "AsyncBatchHandler": "BatchHandler",
    "AsyncBatchAlso": "BatchAlso",
    "AsyncTransactions": "Transactions",
    "AsyncTransactionSource": "TransactionSource",
    "async_transactions": "sync_transactions",
    # the inbox calls
    "receive_async": "receive",
    "record_async": "record",
    "record_on_async": "record_on",
    "run_steps_async": "run_steps",
    # the outbox calls
    "publish_async": "publish",
    "publish_batch_async": "publish_batch",
    "_write_async": "_write",
    # connections and what they come from
    "AsyncRaw": "Raw",
    "AsyncTarget": "Target",
    "resolve_async": "resolve_sync",
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncEngine": "Engine",
    "AsyncSession": "Session",
    "async_sessionmaker": "sessionmaker",
    "AsyncIterator": "Iterator",
    "AsyncGenerator": "Generator",
    "asyncio.sleep": "time.sleep",
}

_ASYNC_ONLY = re.compile(r"#\s*async-only\b")
#: a name that still reads as async code in a generated module
_ASYNC_NAME = re.compile(r"(?:\w*_async|async_\w*|Async\w*|asyncio)")
_WORDS = re.compile(
    r"\b(" + "|".join(sorted(map(re.escape, NAMES), key=len, reverse=True)) + r")\b"
)
#: expressions that need no parentheses once their ``await`` is gone: ``(await x).y`` -> ``x.y``
_PRIMARY = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)


class GenerateError(Exception):
    """The async source uses something this script cannot rewrite."""


def header(source: str) -> str:
    return f"# This file is generated from {source} by tools/async_to_sync.py: do not edit it.\n"


# -- pass 1: the statements marked async-only ---------------------------------------------


def _first_line(node: ast.stmt) -> int:
    decorators: list[ast.expr] = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decorators])


def _marked(tree: ast.Module, lines: list[str]) -> ast.stmt | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and _ASYNC_ONLY.search(lines[_first_line(node) - 1]):
            return node
    return None


def _drop_async_only(text: str, where: str) -> str:
    """The source without its async-only statements (an ``if``'s ``else`` block kept)."""
    while True:
        lines = text.splitlines(keepends=True)
        node = _marked(ast.parse(text, where), lines)
        if node is None:
            return text
        first, last = _first_line(node), node.end_lineno
        assert last is not None
        kept: list[str] = []
        if isinstance(node, ast.If) and node.orelse:
            else_line = node.orelse[0].lineno - 1  # 1-based line of ``else:``, found upwards
            while not re.match(r"\s*else\s*:", lines[else_line - 1]):
                else_line -= 1
                if else_line <= node.lineno:
                    raise GenerateError(f"{where}:{node.lineno}: mark an if/else, not an elif")
            kept = textwrap.dedent("".join(lines[else_line:last])).splitlines(keepends=True)
            indent = re.match(r"\s*", lines[first - 1])
            assert indent is not None
            kept = [indent.group() + line if line.strip() else line for line in kept]
        text = "".join(lines[: first - 1] + kept + lines[last:])


# -- pass 2: async syntax and names --------------------------------------------------------


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    text: str


class _Rewriter:
    def __init__(self, text: str, where: str) -> None:
        self.text = text
        self.where = where
        self.tree = ast.parse(text, where)
        starts = [0]
        for line in text.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        self._starts = starts
        self.edits: list[_Edit] = []

    def offset(self, line: int, col: int) -> int:
        """The text offset of (1-based line, utf-8 byte column), as the ast gives them."""
        start = self._starts[line - 1]
        line_text = self.text[start : self._starts[line]]
        return start + len(line_text.encode()[:col].decode())

    def span(self, node: Any) -> tuple[int, int]:
        """Where ``node`` (an ast node with a position) starts and ends in the text."""
        start = self.offset(node.lineno, node.col_offset)
        return start, self.offset(node.end_lineno, node.end_col_offset)

    def edit(self, start: int, end: int, text: str) -> None:
        self.edits.append(_Edit(start, end, text))

    def drop_keyword(self, node: Any, keyword: str) -> None:
        """Remove ``keyword`` and the blanks after it at the start of ``node``; its end."""
        start, _ = self.span(node)
        match = re.compile(rf"{keyword}\s+").match(self.text, start)
        if match is None:
            raise GenerateError(f"{self.where}:{node.lineno}: expected {keyword!r}")
        self.edit(start, match.end(), "")

    def rename_definition(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    ) -> None:
        if node.name not in NAMES:
            return
        start, _ = self.span(node)
        match = re.compile(rf"(?:async\s+)?(?:def|class)\s+({node.name})\b").search(
            self.text, start
        )
        assert match is not None
        self.edit(match.start(1), match.end(1), NAMES[node.name])

    def unwrap_await(self, node: ast.Await, parent: ast.AST | None) -> None:
        self.drop_keyword(node, "await")
        start, end = self.span(node)
        needs_parentheses = (
            isinstance(parent, ast.Attribute | ast.Subscript) and parent.value is node
        ) or (isinstance(parent, ast.Call) and parent.func is node)
        if not needs_parentheses or not isinstance(node.value, _PRIMARY):
            return
        before = self.text.rfind("(", 0, start)
        after = self.text.find(")", end)
        if self.text[before + 1 : start].strip() or self.text[end:after].strip():
            raise GenerateError(f"{self.where}:{node.lineno}: expected (await ...)")
        if "\n" in self.text[before:after]:
            # the parentheses held the lines together: join them (ruff lays them out again)
            if "#" in self.text[before:after]:
                return  # a comment may be inside: the parentheses are kept
            for blank in re.finditer(r"\s*\n\s*", self.text[before:after]):
                joined = (
                    self.text[before + blank.start() - 1] in "([{"
                    or self.text[before + blank.end()] in ")]}"
                )
                self.edit(before + blank.start(), before + blank.end(), "" if joined else " ")
        self.edit(before, before + 1, "")
        self.edit(after, after + 1, "")

    def rename_words(self, start: int, end: int) -> None:
        segment = self.text[start:end]
        renamed = _WORDS.sub(lambda m: NAMES[m.group()], segment)
        if renamed != segment:
            self.edit(start, end, renamed)

    def run(self) -> str:
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        docstrings = self._docstrings()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.AsyncFunctionDef | ast.AsyncWith | ast.AsyncFor):
                self.drop_keyword(node, "async")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.rename_definition(node)
            elif isinstance(node, ast.Await):
                self.unwrap_await(node, parents.get(node))
            elif isinstance(node, ast.Attribute):
                self._attribute(node, parents)
            elif isinstance(node, ast.Name) and node.id in NAMES:
                if not self._in_dotted(node, parents):
                    start, end = self.span(node)
                    self.edit(start, end, NAMES[node.id])
            elif isinstance(node, ast.alias) and node.name in NAMES:
                start, _ = self.span(node)
                self.edit(start, start + len(node.name), NAMES[node.name])
            elif isinstance(node, ast.comprehension) and node.is_async:
                raise GenerateError(f"{self.where}: async comprehensions are not rewritten")
        for node in ast.walk(self.tree):  # names as strings: __all__
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in NAMES
                and node not in docstrings
            ):
                start, end = self.span(node)
                quote = self.text[start]
                self.edit(start, end, f"{quote}{NAMES[node.value]}{quote}")
        for doc in docstrings:
            self.rename_words(*self.span(doc))
        for token in tokenize.generate_tokens(io.StringIO(self.text).readline):
            if token.type == tokenize.COMMENT and not _ASYNC_ONLY.search(token.string):
                start = self.offset(token.start[0], 0) + token.start[1]
                self.rename_words(start, start + len(token.string))
        return self._apply()

    def _dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def _in_dotted(self, node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
        """True when a dotted name of :data:`NAMES` that contains ``node`` renames it."""
        parent = parents.get(node)
        while isinstance(parent, ast.Attribute):
            if self._dotted(parent) in NAMES:
                return True
            parent = parents.get(parent)
        return False

    def _attribute(self, node: ast.Attribute, parents: dict[ast.AST, ast.AST]) -> None:
        if self._in_dotted(node, parents):
            return
        dotted = self._dotted(node)
        if dotted is not None and dotted in NAMES:
            start, end = self.span(node)
            self.edit(start, end, NAMES[dotted])
        elif node.attr in NAMES:
            _, end = self.span(node)
            self.edit(end - len(node.attr), end, NAMES[node.attr])

    def _docstrings(self) -> list[ast.Constant]:
        found = []
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.body
            ):
                first = node.body[0]
                if (
                    isinstance(first, ast.Expr)
                    and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)
                ):
                    found.append(first.value)
        # the attribute docstrings (a string after an assignment) are not special: skipped
        return found

    def _apply(self) -> str:
        text = self.text
        last = len(text) + 1
        for edit in sorted(set(self.edits), key=lambda e: (e.start, e.end), reverse=True):
            if edit.end > last:
                raise GenerateError(f"{self.where}: overlapping rewrites at offset {edit.start}")
            text = text[: edit.start] + edit.text + text[edit.end :]
            last = edit.start
        return text


# -- the whole generation ------------------------------------------------------------------


def pinned_ruff() -> str:
    """The ruff version the ``test`` extra of ``pyproject.toml`` pins (``ruff==X.Y.Z``)."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    for requirement in extras.get("test", []):
        match = re.fullmatch(r"ruff\s*==\s*([\w.]+)", requirement.strip())
        if match:
            return match.group(1)
    raise GenerateError("pyproject.toml's test extra pins no ruff (ruff==X.Y.Z)")


def check_ruff() -> None:
    """Refuse a ruff other than the pinned one: its format would be another output."""
    wanted = pinned_ruff()
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = done.stdout.split()[-1] if done.returncode == 0 and done.stdout.split() else None
    if found != wanted:
        raise GenerateError(
            f"ruff {found or '(not installed)'} is not the pinned ruff {wanted}: "
            f'pip install "ruff=={wanted}" (pyproject.toml, test extra)'
        )


def _left_async(text: str, where: str) -> None:
    """Fail on a name of a generated module that still reads as async code."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and (
            token.string in ("async", "await") or _ASYNC_NAME.fullmatch(token.string)
        ):
            raise GenerateError(
                f"{where}:{token.start[0]}: {token.string!r} is left in the sync module: "
                "add its sync name to NAMES in tools/async_to_sync.py "
                "(or mark the statement `# async-only`)"
            )


def _awaited_imports(tree: ast.Module, where: str) -> None:
    """Fail on ``await f(...)`` where ``f`` is imported and :data:`NAMES` does not rename it.

    A callable defined in the module is rewritten with it; one taken from another module keeps
    its name, and an awaited one is a coroutine function there: its sync twin, if any, is
    another name, which only the map can give.
    """
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Await) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if isinstance(func, ast.Name) and func.id in imported and func.id not in NAMES:
            raise GenerateError(
                f"{where}:{node.lineno}: awaits {func.id} (from {imported[func.id]}), which "
                "NAMES in tools/async_to_sync.py does not map to a sync name"
            )


def _ruff(args: list[str], text: str, filename: str) -> str:
    done = subprocess.run(  # noqa: S603 (the interpreter running this script, fixed arguments)
        [
            *(sys.executable, "-m", "ruff", *args),
            *("--config", str(ROOT / "pyproject.toml"), "--stdin-filename", filename, "-"),
        ],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise GenerateError(f"ruff {' '.join(args)} failed on {filename}:\n{done.stderr}")
    return done.stdout


def generate(source: str, target: str) -> str:
    """The text of the sync module ``target`` generated from the async module ``source``."""
    text = (ROOT / source).read_text(encoding="utf-8")
    text = _drop_async_only(text, source)
    _awaited_imports(ast.parse(text, source), source)
    text = _Rewriter(text, source).run()
    text = header(source) + text
    text = _ruff(["check", "--fix", "--exit-zero", "--quiet", "--select", "I,F401"], text, target)
    text = _ruff(["format", "--quiet"], text, target)
    _left_async(text, target)  # after ruff: an import only the async code used is gone
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a generated module differs from what its source gives",
    )
    args = parser.parse_args(argv)
    try:
        check_ruff()
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for source, target in MODULES.items():
        try:
            wanted = generate(source, target)
        except (GenerateError, SyntaxError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        path = ROOT / target
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == wanted:
            continue
        if args.check:
            stale.append(target)
        else:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote {target} from {source}")
    for target in stale:
        print(
            f"stale: {target} is not what tools/async_to_sync.py generates from "
            f"{_source_of(target)}: run `python tools/async_to_sync.py`",
            file=sys.stderr,
        )
    return 1 if stale else 0


def _source_of(target: str) -> str:
    return next(s for s, t in MODULES.items() if t == target)


if __name__ == "__main__":
    sys.exit(main())
