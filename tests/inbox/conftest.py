"""Fixtures for the inbox tests."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from tests.inbox.inbox_helpers import EFFECTS_DDL
from tests.support.flavours import FLAVOURS, Flavour, flavour_of


@pytest.fixture
def effects_url(database_url: str) -> str:
    """A fresh database with the inbox tables and an ``effects`` table."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
    return database_url


@pytest.fixture
def pool(effects_url: str) -> Iterator[ConnectionPool]:
    """A small connection pool on ``effects_url``, for the handler runners."""
    with ConnectionPool(effects_url, min_size=1, max_size=2, open=True) as p:
        yield p


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """The sync and the async flavour of receive/record and the runners, in turn."""
    with flavour_of(request.param) as chosen:
        yield chosen
