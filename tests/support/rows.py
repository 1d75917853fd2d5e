"""Find columns of database rows read by position, whatever the variables are called.

A row is what a psycopg (or asyncpg-wrapped) cursor gives: ``.fetchone()``, an element of
``.fetchall()`` / ``.fetchmany()``, an element of a cursor or an ``.execute(...)`` result
iterated. The finder follows a row through assignments (``=``, ``:=``, ``for``,
comprehensions, ``with ... as cur``), through the functions that return one (``return
cur.fetchall()``: every call of that function by name gives rows) and into the parameters of the
functions it is passed to, anywhere in the packages scanned, to a fixed point. It reports:

* ``row[0]``, ``row[:5]``, ``rows[0][4]``: a column by position (an int or a slice);
* ``a, b = row``, ``for a, b in cur.fetchall()``: a row unpacked into names by position;
* ``Record(*row)``: a row spread into arguments by position;
* ``dict(cur.fetchall())``: rows taken as (key, value) pairs by position.

A statement generator's step (``x = yield statement, params``: ``run_steps`` sends back the
statement's first row, or its rows) is a row too.

A column is read by name instead: ``dict_row`` (``row["topic"]``), ``class_row`` or
``kwargs_row`` into a dataclass (``row.topic``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROW, ROWS, CURSOR, SENT = "row", "rows", "cursor", "sent"
_FETCH = {"fetchone": ROW, "fetchall": ROWS, "fetchmany": ROWS}
_CURSORS = {"execute", "stream", "cursor"}
_FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class _Program:
    """What is known across the modules: functions returning rows, parameters given rows."""

    returns: dict[str, str] = field(default_factory=dict)
    params: dict[tuple[str, str], str] = field(default_factory=dict)
    signatures: dict[str, list[str]] = field(default_factory=dict)
    changed: bool = False

    def learn(self, table: dict[object, str], key: object, kind: str) -> None:
        if table.get(key) != kind and kind in (ROW, ROWS, SENT):
            table[key] = kind  # type: ignore[index]
            self.changed = True


class _Scope:
    """One function's body (or a module's top level), nested functions left out."""

    def __init__(self, program: _Program, body: list[ast.stmt], function: str | None) -> None:
        self.program = program
        self.function = function
        self.nodes = [n for stmt in body for n in _walk(stmt)]
        self.names: dict[str, str] = {}
        if function is not None:
            for param in program.signatures.get(function, []):
                kind = program.params.get((function, param))
                if kind:
                    self.names[param] = kind

    def kind(self, node: ast.AST | None) -> str | None:
        while isinstance(node, ast.Await):
            node = node.value
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Yield):
            return SENT  # a statement generator's step: run_steps sends its row (or rows) back
        if isinstance(node, ast.IfExp):
            return self.kind(node.body) or self.kind(node.orelse)
        if isinstance(node, ast.BoolOp):
            return next((k for k in map(self.kind, node.values) if k), None)
        if isinstance(node, ast.Subscript):
            inner = self.kind(node.value)
            if inner in (ROWS, SENT):
                return inner if isinstance(node.slice, ast.Slice) else ROW
            return None
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _call(self, node: ast.Call) -> str | None:
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr in _FETCH:
                return _FETCH[func.attr]
            if func.attr in _CURSORS:
                return CURSOR
            return self.program.returns.get(func.attr) if _is_self(func.value) else None
        if isinstance(func, ast.Name):
            if func.id in ("list", "sorted", "reversed", "iter", "tuple") and node.args:
                return ROWS if self.kind(node.args[0]) in (ROWS, CURSOR) else None
            if func.id == "next" and node.args:
                return ROW if self.kind(node.args[0]) in (ROWS, CURSOR) else None
            return self.program.returns.get(func.id)
        return None

    def bind(self) -> None:
        for _ in range(3):
            for node in self.nodes:
                self._bind(node)
        for node in self.nodes:
            self._flow(node)

    def _target(self, target: ast.AST, kind: str | None) -> None:
        if isinstance(target, ast.Name) and kind:
            self.names[target.id] = kind

    def _bind(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._target(target, self.kind(node.value))
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            self._target(node.target, self.kind(node.value))
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            if self.kind(node.iter) in (ROWS, CURSOR, SENT):
                self._target(node.target, ROW)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if item.optional_vars is not None and self.kind(item.context_expr) == CURSOR:
                    self._target(item.optional_vars, CURSOR)

    def _flow(self, node: ast.AST) -> None:
        """What this scope tells the program: its return kind, and rows passed to functions."""
        if isinstance(node, ast.Return) and self.function is not None:
            kind = self.kind(node.value)
            if kind in (ROW, ROWS):
                self.program.learn(self.program.returns, self.function, kind)  # type: ignore[arg-type]
        if isinstance(node, ast.Call):
            name = _callee(node.func)
            params = self.program.signatures.get(name or "")
            if name is None or params is None:
                return
            for i, arg in enumerate(node.args):
                kind = self.kind(arg)
                if kind in (ROW, ROWS, SENT) and i < len(params):
                    self.program.learn(self.program.params, (name, params[i]), kind)  # type: ignore[arg-type]
            for keyword in node.keywords:
                kind = self.kind(keyword.value)
                if keyword.arg and kind in (ROW, ROWS, SENT):
                    self.program.learn(self.program.params, (name, keyword.arg), kind)  # type: ignore[arg-type]

    def positional(self, where: str) -> Iterator[str]:
        for node in self.nodes:
            if isinstance(node, ast.Subscript) and self.kind(node.value) in (ROW, SENT):
                index = node.slice
                if isinstance(index, ast.Slice) or _is_int(index):
                    yield f"{where}:{node.lineno}: {ast.unparse(node)}"
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "dict"
                and len(node.args) == 1
                and self.kind(node.args[0]) in (ROWS, CURSOR)
            ):
                yield f"{where}:{node.lineno}: {ast.unparse(node)[:80]} (pairs by position)"
            elif isinstance(node, ast.Starred) and self.kind(node.value) == ROW:
                yield f"{where}:{node.lineno}: {ast.unparse(node)} (spread by position)"
            elif isinstance(node, ast.Assign) and self.kind(node.value) in (ROW, SENT):
                if any(isinstance(t, ast.Tuple | ast.List) for t in node.targets):
                    yield f"{where}:{node.lineno}: {ast.unparse(node)[:80]}"
            elif (
                isinstance(node, ast.For | ast.AsyncFor | ast.comprehension)
                and isinstance(node.target, ast.Tuple | ast.List)
                and self.kind(node.iter) in (ROWS, CURSOR, SENT)
            ):
                line = node.target.lineno
                yield f"{where}:{line}: for {ast.unparse(node.target)} in ..."


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _callee(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and _is_self(func.value):
        return func.attr
    return None


def _is_int(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int)


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, _FUNCTIONS | ast.Lambda | ast.ClassDef):
            yield from _walk(child)


def _scopes(tree: ast.Module) -> Iterator[tuple[list[ast.stmt], str | None]]:
    yield [n for n in tree.body if not isinstance(n, _FUNCTIONS | ast.ClassDef)], None
    for node in ast.walk(tree):
        if isinstance(node, _FUNCTIONS):
            yield node.body, node.name


def positional_reads(sources: Iterable[tuple[str, str]]) -> list[str]:
    """``where:line: code`` of every column read by position in ``sources`` ((where, text)
    pairs, read as one program)."""
    trees = [(where, ast.parse(text, where)) for where, text in sources]
    program = _Program()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, _FUNCTIONS):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                program.signatures[node.name] = [n for n in names if n not in ("self", "cls")]
    for _ in range(10):  # to a fixed point: rows flow through returns and parameters
        program.changed = False
        for _, tree in trees:
            for body, function in _scopes(tree):
                _Scope(program, body, function).bind()
        if not program.changed:
            break
    found = []
    for where, tree in trees:
        for body, function in _scopes(tree):
            scope = _Scope(program, body, function)
            scope.bind()
            found.extend(scope.positional(where))
    return sorted(set(found))


def package_sources(root: Path, packages: Iterable[str]) -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(root)), path.read_text(encoding="utf-8"))
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    ]
