"""Keys waiting for a predecessor are visible: `blocked_keys` and `outbox inbox blocked`."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from click.testing import CliRunner
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, Outcome
from inbox.admin import blocked_keys
from inbox.cli import commands
from outbox import ConfigurationError
from tests.inbox.inbox_helpers import apply_effect, make_envelope

_NOW = dt.timedelta(0)


def _runner(pool: ConnectionPool) -> HandlerRunner:
    return HandlerRunner(pool, lambda c, m: apply_effect(c, "c", m), consumer="c", ordered=True)


def test_a_key_refusing_early_messages_is_listed_until_it_moves_on(
    pool: ConnectionPool, effects_url: str
) -> None:
    runner = _runner(pool)
    first, second, third = (make_envelope(key="K", seq=s) for s in (1, 2, 3))
    assert runner.handle(first).outcome is Outcome.PROCESSED
    assert blocked_keys(effects_url, min_age=_NOW) == []
    assert runner.handle(third).outcome is Outcome.OUT_OF_ORDER
    assert runner.handle(third).outcome is Outcome.OUT_OF_ORDER
    assert runner.handle(make_envelope(key="other", seq=2)).outcome is Outcome.OUT_OF_ORDER
    listed = {k.key: k for k in blocked_keys(effects_url, min_age=_NOW)}
    assert set(listed) == {"K", "other"}
    key = listed["K"]
    assert (key.consumer, key.topic, key.last_seq, key.waiting_seq, key.out_of_order) == (
        "c",
        "orders",
        1,
        3,
        2,
    )
    assert key.dead_id is None
    assert key.waited >= _NOW
    # not yet old enough for a threshold of an hour; only one consumer asked for
    assert blocked_keys(effects_url, min_age=dt.timedelta(hours=1)) == []
    assert blocked_keys(effects_url, consumer="nobody", min_age=_NOW) == []
    assert runner.handle(second).outcome is Outcome.PROCESSED  # the gap fills: moved on
    assert [k.key for k in blocked_keys(effects_url, min_age=_NOW)] == ["other"]
    assert runner.handle(third).outcome is Outcome.PROCESSED
    assert [k.key for k in blocked_keys(effects_url, min_age=_NOW, limit=1)] == ["other"]


def test_cli_lists_one_line_per_key_and_exits_1(pool: ConnectionPool, effects_url: str) -> None:
    runner = _runner(pool)
    assert runner.handle(make_envelope(key="a\nb", seq=2)).outcome is Outcome.OUT_OF_ORDER
    cli = CliRunner()
    args = ["blocked", "--url", effects_url, "--min-age-seconds", "0"]
    text = cli.invoke(commands[0], args)
    assert text.exit_code == 1, text.output
    lines = text.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].split("\t")[:5] == ["c", "orders", "a\\nb", "applied=0", "waiting_for=1"]
    as_json = cli.invoke(commands[0], [*args, "--json"])
    assert as_json.exit_code == 1
    [doc] = json.loads(as_json.stdout)
    assert (doc["key"], doc["waiting_seq"], doc["out_of_order"]) == ("a\nb", 2, 1)
    quiet = cli.invoke(commands[0], ["blocked", "--url", effects_url])  # default: a minute
    assert (quiet.exit_code, quiet.stdout) == (0, "")


def test_one_key_of_two_origins_waits_on_its_own_and_says_which(
    pool: ConnectionPool, effects_url: str
) -> None:
    """Two databases number key K each from 1: tenant-a's seq 1 leaves tenant-b's K waiting
    for its own seq 1 (not judged stale), and the listing names the origin."""
    runner = _runner(pool)
    a1 = make_envelope(key="K", seq=1, origin="tenant-a")
    assert runner.handle(a1).outcome is Outcome.PROCESSED
    assert runner.handle(make_envelope(key="K", seq=2, origin="tenant-b")).outcome is (
        Outcome.OUT_OF_ORDER
    )
    [waiting] = blocked_keys(effects_url, min_age=_NOW)
    assert (waiting.origin, waiting.key, waiting.last_seq) == ("tenant-b", "K", 0)
    text = CliRunner().invoke(
        commands[0], ["blocked", "--url", effects_url, "--min-age-seconds", "0"]
    )
    assert text.stdout.rstrip("\n").endswith("\torigin=tenant-b")
    assert runner.handle(make_envelope(key="K", seq=1, origin="tenant-b")).outcome is (
        Outcome.PROCESSED
    )
    assert blocked_keys(effects_url, min_age=_NOW) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"min_age": 5}, "min_age must be a timedelta"), ({"limit": 0}, "limit must be")],
)
def test_bad_arguments_are_named(effects_url: str, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        blocked_keys(effects_url, **kwargs)  # type: ignore[arg-type]
