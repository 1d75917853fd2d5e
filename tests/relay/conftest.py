"""Fixtures of the relay tests; the helpers are in relay_helpers.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def url(database_url: str) -> str:
    return database_url
