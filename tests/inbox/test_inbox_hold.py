"""Key-aware dead letters: on_dead="hold" parks a key behind its dead message until an operator
retries or purges it; the consumer then applies the decision and the parked messages in order.
On a real PostgreSQL; end to end on every live broker (and on_dead="skip" beside it)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from inbox import AsyncHandlerRunner, HandlerRunner, Outcome
from inbox.admin import HeldFilter, dead_audit, dead_purge, dead_retry, held_keys
from inbox.cli import commands
from inbox.testing import ResultLog, wait_until_processed
from outbox import ConfigurationError
from tests.inbox.broker_fixtures import BROKERS
from tests.inbox.inbox_helpers import apply_effect, effects, inbox_rows, make_envelope
from tests.inbox.test_inbox_brokers import _broker
from tests.support.flavours import Flavour


class Parser:
    """The handler: a message whose payload is b"poison" fails while ``broken``."""

    def __init__(self, consumer: str = "c") -> None:
        self.broken = True
        self.consumer = consumer

    def __call__(self, conn: Any, msg: Any) -> None:
        if self.broken and msg.payload == b"poison":
            raise ValueError(f"cannot parse {msg.seq}")
        apply_effect(conn, self.consumer, msg)


def _key(seqs: range, poison: set[int], key: str = "K") -> list[Any]:
    return [
        make_envelope(key=key, seq=s, payload=b"poison" if s in poison else b"ok") for s in seqs
    ]


def _applied(url: str, consumer: str, key: str) -> list[int]:
    return [row[3] for row in effects(url, consumer) if row[2] == key]


class Poison:
    """A runner's ``fail``: a message whose payload is b"poison" fails while ``broken``."""

    def __init__(self) -> None:
        self.broken = True

    def __call__(self, msg: Any) -> None:
        if self.broken and msg.payload == b"poison":
            raise ValueError(f"cannot parse {msg.seq}")


def test_hold_parks_the_key_until_a_retry_then_applies_in_order(
    flavour: Flavour, effects_url: str
) -> None:
    parser = Poison()
    runner = flavour.runner(effects_url, fail=parser, ordered=True, max_attempts=2, on_dead="hold")
    k1, k2, k3, k4, k5 = _key(range(1, 6), poison={2})
    assert runner.handle(k1).outcome is Outcome.PROCESSED
    assert [runner.handle(k2).outcome for _ in range(2)] == [Outcome.FAILED, Outcome.DEAD]
    assert runner.handle(k4).outcome is Outcome.PARKED  # later messages: kept, acknowledged
    assert runner.handle(k3).outcome is Outcome.PARKED
    assert Outcome.PARKED.ack
    assert runner.handle(k3).outcome is Outcome.DUPLICATE  # a redelivery of a parked one
    assert runner.handle(k2).outcome is Outcome.DUPLICATE  # and of the dead one
    other = make_envelope(key="L", seq=1)
    assert runner.handle(other).outcome is Outcome.PROCESSED  # other keys never wait
    assert runner.resolve_held() == []  # nobody decided yet: nothing moves
    assert _applied(effects_url, "c", "K") == [1]
    [held] = held_keys(effects_url)
    assert (held.consumer, held.key, held.seq, held.message_id, held.parked) == (
        "c",
        "K",
        2,
        k2.id,
        2,
    )
    # attempts counts deliveries: two failed, one redelivered after it was dead
    assert (held.decision, held.attempts, held.last_error) == (
        None,
        3,
        "ValueError: cannot parse 2",
    )

    parser.broken = False  # the fix is deployed; the operator retries the dead message
    decided = dead_retry(effects_url, HeldFilter(key="K"), reason="parser fixed", actor="alice")
    assert decided == [k2.id]
    assert held_keys(effects_url)[0].decision == "retry"
    results = runner.resolve_held()
    assert [(r.message_id, r.outcome) for r in results] == [
        (k2.id, Outcome.PROCESSED),
        (k3.id, Outcome.PROCESSED),
        (k4.id, Outcome.PROCESSED),
    ]
    assert _applied(effects_url, "c", "K") == [1, 2, 3, 4]
    assert held_keys(effects_url) == []
    assert runner.handle(k5).outcome is Outcome.PROCESSED
    assert runner.handle(k3).outcome is Outcome.DUPLICATE
    assert {row[0] for row in inbox_rows(effects_url, "c").values()} == {"processed"}
    audit = [
        (a["actor"], a["action"], a["message_id"], a["reason"]) for a in dead_audit(effects_url)
    ]
    assert audit[1] == ("alice", "retry", k2.id, "parser fixed")
    assert audit[0][1:] == ("retried", k2.id, None)
    assert audit[0][0].startswith("consumer:c@")


def test_purge_moves_the_key_on_without_the_dead_effect(flavour: Flavour, effects_url: str) -> None:
    runner = flavour.runner(
        effects_url, fail=Poison(), ordered=True, max_attempts=1, on_dead="hold"
    )
    k1, k2, k3 = _key(range(1, 4), poison={1})  # the key's very first message dies
    assert runner.handle(k1).outcome is Outcome.DEAD
    assert runner.handle(k3).outcome is Outcome.PARKED
    assert runner.handle(k2).outcome is Outcome.PARKED
    assert dead_purge(effects_url, HeldFilter(ids=[k1.id]), dry_run=True) == [k1.id]
    assert held_keys(effects_url)[0].decision is None  # a dry run changes nothing
    assert dead_purge(effects_url, HeldFilter(consumer="c"), reason="bad data", actor="bob") == [
        k1.id
    ]
    assert [r.outcome for r in runner.resolve_held()] == [Outcome.PROCESSED, Outcome.PROCESSED]
    assert _applied(effects_url, "c", "K") == [2, 3]
    assert inbox_rows(effects_url, "c")[k1.id][0] == "dead"  # given up, still on record
    assert runner.resolve_held() == []  # applying a decision twice changes nothing
    assert [a["action"] for a in dead_audit(effects_url)] == ["purged", "purge"]


def test_a_retry_that_fails_again_stays_held_and_a_parked_failure_holds_the_key(
    pool: ConnectionPool, effects_url: str
) -> None:
    msgs = _key(range(1, 5), poison={1, 3})
    fixed: set[int] = set()  # seqs whose poison the handler can parse by now

    def handler(conn: Any, msg: Any) -> None:
        if msg.payload == b"poison" and msg.seq not in fixed:
            raise ValueError(f"cannot parse {msg.seq}")
        apply_effect(conn, "c", msg)

    runner = HandlerRunner(
        pool, handler, consumer="c", ordered=True, max_attempts=2, on_dead="hold"
    )
    assert [runner.handle(msgs[0]).outcome for _ in range(2)] == [Outcome.FAILED, Outcome.DEAD]
    for later in msgs[1:]:
        assert runner.handle(later).outcome is Outcome.PARKED
    dead_retry(effects_url, HeldFilter(key="K"), actor="alice")
    [again] = runner.resolve_held()  # not fixed yet: dead again, the key still held
    assert (again.message_id, again.outcome) == (msgs[0].id, Outcome.DEAD)
    [held] = held_keys(effects_url)
    assert (held.message_id, held.decision, held.parked) == (msgs[0].id, None, 3)
    assert [a["action"] for a in dead_audit(effects_url)] == ["retry_failed", "retry"]
    assert runner.resolve_held() == []  # a failed retry waits for the next decision

    fixed.add(1)  # seq 1 parses now, seq 3 still does not
    dead_retry(effects_url, HeldFilter(key="K"), actor="alice")
    outcomes = [(r.message_id, r.outcome) for r in runner.resolve_held()]
    assert outcomes == [
        (msgs[0].id, Outcome.PROCESSED),
        (msgs[1].id, Outcome.PROCESSED),
        (msgs[2].id, Outcome.FAILED),  # one of its two attempts: parked again
    ]
    assert held_keys(effects_url) == []
    [dead] = runner.resolve_held()  # its second attempt: dead, and now it holds the key
    assert (dead.message_id, dead.outcome, dead.attempts) == (msgs[2].id, Outcome.DEAD, 2)
    [held] = held_keys(effects_url)
    assert (held.message_id, held.seq, held.parked) == (msgs[2].id, 3, 1)
    assert _applied(effects_url, "c", "K") == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on_dead": "hold"}, "needs ordered=True"),
        ({"on_dead": "park", "ordered": True}, "on_dead must be 'skip'"),
    ],
)
def test_bad_on_dead_is_named(pool: ConnectionPool, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        HandlerRunner(pool, Parser(), consumer="c", **kwargs)


def test_cli_held_retry_purge_audit(pool: ConnectionPool, effects_url: str) -> None:
    runner = HandlerRunner(
        pool, Parser(), consumer="c", ordered=True, max_attempts=1, on_dead="hold"
    )
    dead, parked = _key(range(1, 3), poison={1}, key="a\tb")
    assert runner.handle(dead).outcome is Outcome.DEAD
    assert runner.handle(parked).outcome is Outcome.PARKED
    cli, group = CliRunner(), commands[0]
    url = ["--url", effects_url]
    listed = cli.invoke(group, ["held", *url])
    assert listed.exit_code == 0, listed.output
    [line] = listed.stdout.splitlines()
    fields = line.split("\t")
    assert fields[:5] == ["c", "orders", "a\\tb", "seq=1", f"dead={dead.id}"]
    assert "parked=1" in fields
    [doc] = json.loads(cli.invoke(group, ["held", *url, "--json"]).stdout)
    assert (doc["key"], doc["parked"], doc["decision"]) == ("a\tb", 1, None)
    refused = cli.invoke(group, ["dead", "retry", *url])
    assert refused.exit_code == 2
    assert "Pass --all" in refused.output
    unknown = cli.invoke(group, ["dead", "purge", *url, "--id", str(uuid.uuid4())])
    assert unknown.exit_code == 1
    assert "no held dead message matched" in unknown.output
    dry = cli.invoke(group, ["dead", "retry", *url, "--all", "--dry-run"])
    assert (dry.exit_code, dry.stdout.strip()) == (0, str(dead.id))
    assert dead_audit(effects_url) == []
    done = cli.invoke(
        group, ["dead", "retry", *url, "--id", str(dead.id), "--reason", "fixed", "--actor", "ops"]
    )
    assert (done.exit_code, done.stdout.strip()) == (0, str(dead.id))
    audit = cli.invoke(group, ["dead", "audit", *url])
    [row] = audit.stdout.splitlines()
    assert row.split("\t")[1:5] == ["ops", "retry", "c", str(dead.id)]


async def _live(name: str, url: str, on_dead: str) -> tuple[ResultLog, list[Any], list[Any]]:
    """Key K (seq 1-4, seq 2 poison) and key L over a live broker; with hold, the operator
    retries the dead message once it has parked the rest, and the consumer applies them."""
    broker = _broker(name)
    parser = Parser("svc")
    log = ResultLog()
    k_msgs, l_msgs = _key(range(1, 5), poison={2}), _key(range(1, 3), poison=set(), key="L")
    await broker.setup()
    try:
        async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as apool:

            async def handler(conn: Any, msg: Any) -> None:
                if parser.broken and msg.payload == b"poison":
                    raise ValueError("cannot parse")
                await conn.execute(
                    "INSERT INTO effects (consumer, message_id, key, seq) "
                    "VALUES ('svc', %s, %s, %s)",
                    (msg.id, msg.key, msg.seq),
                )

            runner = AsyncHandlerRunner(
                apool, handler, consumer="svc", ordered=True, max_attempts=2, on_dead=on_dead
            )
            consumer = broker.consumer(runner, log, 0)
            consumer.hold_interval = 0.1
            task = asyncio.create_task(consumer.run())
            async with asyncio.timeout(30):
                await consumer.ready.wait()
            # in seq order, as the relay publishes a key
            await broker.publish([k_msgs[0], l_msgs[0], k_msgs[1], k_msgs[2], l_msgs[1]])
            await broker.publish([k_msgs[3]])
            await log.wait_processed([m.id for m in k_msgs + l_msgs], within=60)
            if on_dead == "hold":
                assert _applied(url, "svc", "K") == [1]  # parked behind the dead seq 2
                [held] = held_keys(url, HeldFilter(consumer="svc"))
                assert (held.message_id, held.parked) == (k_msgs[1].id, 2)
                parser.broken = False
                dead_retry(url, HeldFilter(consumer="svc", key="K"), reason="fixed")
                wanted = [m.id for m in k_msgs]
                await asyncio.to_thread(
                    wait_until_processed, url, consumer="svc", ids=wanted, timeout=30
                )
            consumer.stop()
            await task
    finally:
        await broker.teardown()
    return log, k_msgs, l_msgs


@pytest.mark.parametrize("name", list(BROKERS))
def test_live_hold_then_retry_applies_the_key_in_order(effects_url: str, name: str) -> None:
    log, k_msgs, _ = asyncio.run(_live(name, effects_url, "hold"))
    assert k_msgs[1].id in log.outcomes(Outcome.DEAD)
    assert set(log.outcomes(Outcome.PARKED)) == {k_msgs[2].id, k_msgs[3].id}
    assert _applied(effects_url, "svc", "K") == [1, 2, 3, 4]
    assert _applied(effects_url, "svc", "L") == [1, 2]
    assert held_keys(effects_url) == []


@pytest.mark.parametrize("name", list(BROKERS))
def test_live_skip_moves_the_key_on_past_its_dead_message(effects_url: str, name: str) -> None:
    log, k_msgs, _ = asyncio.run(_live(name, effects_url, "skip"))
    assert log.outcomes(Outcome.DEAD) == [k_msgs[1].id]
    assert _applied(effects_url, "svc", "K") == [1, 3, 4]
    assert _applied(effects_url, "svc", "L") == [1, 2]
