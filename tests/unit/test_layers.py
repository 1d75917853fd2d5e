"""Packages take from one another only public modules and names.

outbox's modules are private (``outbox._*``); what the packages above it use of it is
:mod:`outbox.kit` and its public modules. A private name of another package (``relay._admin``,
``inbox._dead``, ``from relay._statements import _DEAD_FILTER``) ties a package to what the
other may change at any time, and hides an upward import from the reader: this test fails on
any, whatever form the import takes. The direction of the imports is import-linter's
(``[tool.importlinter]`` in pyproject.toml, with no exception).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: package folder -> the package it belongs to (migrations ship as outbox_migrations: outbox's)
PACKAGES = {
    "outbox": "outbox",
    "migrations": "outbox",
    "inbox": "inbox",
    "relay": "relay",
    "spark_ingest": "spark_ingest",
    "outbox_console": "outbox_console",
}
#: the top-level names those packages are imported by
OWNERS = {"outbox": "outbox", "outbox_migrations": "outbox", "migrations": "outbox"} | {
    p: p for p in ("inbox", "relay", "spark_ingest", "outbox_console")
}


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in dotted.split(".")[1:])


def private_imports(source: str, package: str, where: str = "<source>") -> list[str]:
    """``where:line: module`` of each import in ``source`` (a module of ``package``) that takes
    a private module or name of another package."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            taken = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            taken = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for dotted in taken:
            owner = OWNERS.get(dotted.split(".")[0])
            if owner is not None and owner != package and _private(dotted):
                found.append(f"{where}:{node.lineno}: {dotted}")
    return found


def test_no_package_imports_a_private_module_or_name_of_another() -> None:
    found = [
        hit
        for folder, package in PACKAGES.items()
        for path in sorted((ROOT / folder).rglob("*.py"))
        for hit in private_imports(
            path.read_text(encoding="utf-8"), package, str(path.relative_to(ROOT))
        )
    ]
    assert found == []


def test_the_check_finds_every_form_of_a_private_import() -> None:
    source = (
        "import inbox._dead as inbox_dead\n"
        "from relay._statements import _DEAD_FILTER\n"
        "from relay._admin import DeadFilter\n"
        "from relay.admin import _change\n"
        "from outbox import _redact\n"
        "def f():\n"
        "    from spark_ingest._config import JobConfig\n"
        # public, or the package's own: not found
        "from relay.admin import DeadFilter\n"
        "from outbox_console._statements import console_statements\n"
        "from outbox.kit import redact\n"
    )
    assert private_imports(source, "outbox_console") == [
        "<source>:1: inbox._dead",
        "<source>:2: relay._statements._DEAD_FILTER",
        "<source>:3: relay._admin.DeadFilter",
        "<source>:4: relay.admin._change",
        "<source>:5: outbox._redact",
        "<source>:7: spark_ingest._config.JobConfig",
    ]


def test_the_layers_contract_has_no_exception() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    assert contracts
    assert [c["name"] for c in contracts if c.get("ignore_imports")] == []
