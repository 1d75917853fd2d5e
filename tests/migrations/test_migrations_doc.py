"""The alembic.ini snippet of docs/how-to/migrations.md works as written."""

from __future__ import annotations

import re
from pathlib import Path

from alembic.config import Config

from outbox._migrate import configured_schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "migrations.md"


def _ini_snippet() -> str:
    blocks = re.findall(r"```ini\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    (snippet,) = [b for b in blocks if "[outbox]" in b]
    return snippet


def test_migrations_doc_ini_snippet_sets_the_schema(tmp_path: Path) -> None:
    ini = tmp_path / "alembic.ini"
    ini.write_text(_ini_snippet())
    config = Config(str(ini))
    assert configured_schema(config) == "messaging"
    locations = config.get_main_option("version_locations")
    assert locations == f"{tmp_path}/alembic/versions outbox_migrations:versions"
