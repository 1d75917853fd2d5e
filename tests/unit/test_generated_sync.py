"""The sync modules generated from their async sources are current: what
``tools/async_to_sync.py`` generates now is what the repository holds."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "async_to_sync.py"


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tools/async_to_sync.py, imported (it is a script, not a package's module)."""
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_generated_sync_modules_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_module_is_named_and_written_again(
    tool: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, target = next(iter(tool.MODULES.items()))
    copy = tmp_path / Path(target).name
    copy.write_text((ROOT / target).read_text(encoding="utf-8") + "# edited by hand\n")
    monkeypatch.setattr(tool, "MODULES", {source: str(copy)})
    assert tool.main(["--check"]) == 1
    assert f"stale: {copy} is not what tools/async_to_sync.py generates from {source}" in (
        capsys.readouterr().err
    )
    assert tool.main([]) == 0  # written again from the source
    assert tool.main(["--check"]) == 0
    assert copy.read_text(encoding="utf-8") == (ROOT / target).read_text(encoding="utf-8")


def test_generated_modules_say_so_in_their_first_line(tool: ModuleType) -> None:
    for source, target in tool.MODULES.items():
        first = (ROOT / target).read_text(encoding="utf-8").splitlines()[0]
        assert first == f"# This file is generated from {source} by tools/async_to_sync.py: " + (
            "do not edit it."
        )


def test_the_rewrite_of_async_code(tool: ModuleType) -> None:
    source = '''\
async def record_on_async(raw: AsyncRaw) -> int:
    """Like :func:`run_steps_async`."""
    async with raw.cursor() as cur:  # run_steps_async's cursor
        n = (await cur.execute("x")).rowcount
        rows = await (
            await cur.execute("y")
        ).fetchall()
    if isinstance(raw, AsyncpgConnection):  # async-only: asyncpg's wrapper
        await asyncio.sleep(n)
    else:
        await asyncio.sleep(len(rows))
    return n


__all__ = ["record_on_async"]
'''
    text = tool._drop_async_only(source, "example.py")
    assert (
        tool._Rewriter(text, "example.py").run()
        == '''\
def record_on(raw: Raw) -> int:
    """Like :func:`run_steps`."""
    with raw.cursor() as cur:  # run_steps's cursor
        n = cur.execute("x").rowcount
        rows = cur.execute("y").fetchall()
    time.sleep(len(rows))
    return n


__all__ = ["record_on"]
'''
    )


def test_a_name_missing_from_the_map_fails_the_generation(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generator fails closed: a call whose sync name the map lacks is not left as a
    coroutine function called from sync code."""
    source = tmp_path / "_settle_async.py"
    source.write_text(
        "from inbox._settle import settle_async\n\n\n"
        "async def settle_all(raws: list[object]) -> None:\n"
        "    for raw in raws:\n"
        "        await settle_async(raw)\n"
    )
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    with pytest.raises(tool.GenerateError, match=r"awaits settle_async \(from inbox\._settle"):
        tool.generate(source.name, "_settle_sync.py")


def test_an_entry_removed_from_the_map_fails_every_module_using_it(
    tool: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    names = dict(tool.NAMES)
    del names["run_steps_async"]
    monkeypatch.setattr(tool, "NAMES", names)
    monkeypatch.setattr(
        tool, "_WORDS", re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    )
    assert tool.main(["--check"]) == 2
    assert "run_steps_async" in capsys.readouterr().err


def test_an_async_name_left_after_the_rewrite_is_an_error(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not awaited, not imported, still async: a name defined in the module and not in the map."""
    source = tmp_path / "_gauge_async.py"
    source.write_text(
        "async def gauge_async() -> int:\n    return 1\n\n\n"
        "async def read() -> int:\n    return await gauge_async()\n"
    )
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    with pytest.raises(tool.GenerateError, match=r"_gauge_sync\.py:\d+: 'gauge_async' is left"):
        tool.generate(source.name, "_gauge_sync.py")


def test_ruff_is_pinned_and_another_version_is_refused(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", tool.pinned_ruff())
    tool.check_ruff()  # the venv's ruff is the pinned one
    pyproject = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(re.sub(r'"ruff==[\w.]+"', '"ruff==0.0.1"', pyproject))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    with pytest.raises(tool.GenerateError, match=r"is not the pinned ruff 0\.0\.1"):
        tool.check_ruff()
