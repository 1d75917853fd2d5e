"""The sync modules generated from their async sources are current: what
``tools/async_to_sync.py`` generates now is what the repository holds."""

from __future__ import annotations

import importlib.util
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
