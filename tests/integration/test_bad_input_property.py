"""publish() over arbitrary input (hypothesis) on the real database: it either writes the
message or raises an InvalidMessageError (or a subclass) that names the problem, writes
nothing, and leaves the caller's transaction usable. Never a TypeError, a driver error or an
aborted transaction from inside the library."""

from __future__ import annotations

from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import InvalidMessageError, publish

_evil_text = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec=None), max_size=10),  # NUL, surrogates, anything
    st.just("x" * 1500),  # above the key's 1,024 UTF-8 bytes
    st.just("é" * 200),  # 400 bytes: above the topic's 255
)
_wrong_types = st.one_of(st.none(), st.integers(), st.binary(max_size=8), st.floats())
_field = st.one_of(_evil_text, _wrong_types)
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_payload = st.one_of(_json, st.binary(max_size=8), st.sets(st.integers(), max_size=2))
_headers = st.one_of(
    st.none(),
    st.dictionaries(_field, _field, max_size=3),
    st.just({"h": "v" * 5000}),  # huge
    st.just({"Outbox-Id": "x"}),  # reserved
)


def _count(conn: psycopg.Connection[Any]) -> int:
    """The messages written: in the ledger, where every writer puts them, and outbox_messages."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM outbox_wal_pending) + (SELECT count(*) FROM outbox_messages)"
    ).fetchone()
    assert row is not None
    return int(row[0])


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(topic=_field, key=_field, payload=_payload, headers=_headers)
def test_publish_writes_or_names_the_problem_and_writes_nothing(
    pg_conn: psycopg.Connection[Any], topic: Any, key: Any, payload: Any, headers: Any
) -> None:
    before = _count(pg_conn)
    try:
        publish(
            pg_conn, topic=topic, key=key, payload=payload, headers=headers, max_payload_bytes=4096
        )
        written = 1
    except InvalidMessageError as exc:
        problem, written = str(exc), 0
        assert problem  # a message that says what was wrong
    assert _count(pg_conn) == before + written  # nothing written on error; still usable
