"""Fixtures for the inbox tests."""

from __future__ import annotations

import psycopg
import pytest
from inbox_helpers import EFFECTS_DDL


@pytest.fixture
def effects_url(database_url: str) -> str:
    """A fresh database with the inbox tables and an ``effects`` table."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
    return database_url
