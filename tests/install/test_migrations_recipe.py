"""docs/how-to/migrations.md's own-Alembic recipe, run as a user runs it: the wheel in a clean
virtualenv, a fresh ``alembic init``, the page's ``alembic.ini`` lines and ``env.py`` block,
its commands; with the ``[outbox]`` schema and without it.

Checked: our revisions are applied; the user's first revision starts the user's own branch
in the user's folder (not in site-packages, not on our branch); ``alembic check`` is clean.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox._migrate import sqlalchemy_url

Env = Any
PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "migrations.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def _section() -> list[tuple[str, str]]:
    text = PAGE.read_text()
    start = text.index("## Inside your application's Alembic environment")
    end = text.index("\n## ", start + 1)
    return FENCE.findall(text[start:end])


def _apply_ini(ini: str, snippet: str, url: str, schema: bool) -> str:
    """The page's lines set in the generated alembic.ini (and sqlalchemy.url, as it says)."""
    section = "alembic"
    extra: list[str] = []
    for line in snippet.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
            if section != "alembic":
                extra.append(line)
            continue
        if section != "alembic":
            extra.append(line)
            continue
        if "=" not in line:
            continue
        key = line.split("=", 1)[0].strip()
        # "change" a line alembic init wrote, or "add" one (in place of its commented example)
        ini, n = re.subn(rf"(?m)^{re.escape(key)} = .*$", line, ini, count=1)
        if n == 0:
            ini, n = re.subn(rf"(?m)^# ?{re.escape(key)} = .*$", line, ini, count=1)
        assert n == 1, f"alembic.ini has no line for {key}"
    ini = re.sub(r"(?m)^sqlalchemy\.url = .*$", f"sqlalchemy.url = {url}", ini)
    if schema:
        ini += "\n" + "\n".join(extra) + "\n"
    return ini


def _apply_env(env_py: str, block: str, schema: bool) -> str:
    assert "target_metadata = None" in env_py
    if not schema:
        block = block.replace('schema="messaging"', "schema=None").replace("messaging.", "")
    env_py = env_py.replace("target_metadata = None", block)
    if schema:  # "add include_schemas=True to both context.configure(...) calls"
        assert env_py.count("context.configure(") == 2
        env_py = env_py.replace(
            "context.configure(", "context.configure(\n        include_schemas=True,"
        )
    return env_py


@pytest.mark.parametrize("schema", [True, False], ids=["schema messaging", "no schema"])
def test_the_own_alembic_recipe_runs_as_written(
    installed: Callable[[str], Env], project: Path, empty_database_url: str, schema: bool
) -> None:
    env = installed("")
    blocks = _section()
    bash = [code for lang, code in blocks if lang == "bash"]
    (ini_snippet,) = [code for lang, code in blocks if lang == "ini"]
    (env_block,) = [code for lang, code in blocks if lang == "python"]
    assert len(bash) == 2
    url = sqlalchemy_url(empty_database_url).render_as_string(hide_password=False)

    def sh(code: str) -> str:
        done = env.run(["bash", "-c", f"set -euo pipefail\n{code}"], cwd=project)
        assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    sh(bash[0])  # alembic init alembic
    ini = project / "alembic.ini"
    ini.write_text(_apply_ini(ini.read_text(), ini_snippet, url, schema))
    env_py = project / "alembic" / "env.py"
    env_py.write_text(_apply_env(env_py.read_text(), env_block, schema))
    out = sh(bash[1])
    assert "No new upgrade operations detected." in out
    # the user's revisions are in the user's folder, on the user's branch
    mine = sorted(p.name for p in (project / "alembic" / "versions").glob("*.py"))
    assert len(mine) == 2, mine
    first = next(p for p in (project / "alembic" / "versions").glob("*create_the_app*"))
    text = first.read_text()
    assert "down_revision: Union[str, Sequence[str], None] = None" in text or (
        "down_revision = None" in text
    ), text
    assert "branch_labels" in text
    assert "'app'" in text.replace('"', "'")
    site = env.run([str(env.python), "-c", "import outbox_migrations, pathlib; print("
                    "sorted(p.name for p in (pathlib.Path(outbox_migrations.__file__).parent"
                    " / 'versions').glob('*.py')))"], cwd=project)  # fmt: skip
    assert "create_the_app" not in site.stdout
    assert "add_a_column" not in site.stdout
    where = "messaging" if schema else "public"
    with psycopg.connect(empty_database_url) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (where,),
        )}  # fmt: skip
        heads = {r[0] for r in conn.execute("SELECT version_num FROM public.alembic_version")}
    assert {"outbox_messages", "inbox_messages"} <= tables
    assert len(heads) == 2  # ours and the user's branch
