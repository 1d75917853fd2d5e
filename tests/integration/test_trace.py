"""``outbox trace`` on real databases: an outbox database and two inbox databases, messages
brought into each state by the real relay (publishing through a recording adapter) and the
real inbox (HandlerRunner): pending, published and applied, applied by one consumer of two,
dead at the relay, dead at a consumer, held, never committed."""

from __future__ import annotations

import asyncio
import json
import shlex
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, Outcome
from outbox import (
    MessageNotFoundError,
    TraceSource,
    TraceSources,
    id_from_idempotency_key,
    publish,
    trace_message,
)
from outbox.cli import main
from outbox.envelope import Envelope
from relay import Relay, RelayConfig
from tests.support.harness import PgServer
from tests.support.ledger import record
from tests.support.recorder import Recorder


@pytest.fixture
def dbs(pg_server: PgServer, template_db: str) -> Iterator[tuple[str, str, str]]:
    with (
        pg_server.fresh_database(template=template_db) as outbox_url,
        pg_server.fresh_database(template=template_db) as billing_url,
        pg_server.fresh_database(template=template_db) as shipping_url,
    ):
        yield outbox_url, billing_url, shipping_url


def _write(url: str, key: str, payloads: Sequence[str], **extra: Any) -> list[uuid.UUID]:
    """Publish and commit; numbered into outbox_messages as a relay's ledger reader does
    (before it publishes them). A message still in the ledger: test_trace_ledger.py."""
    with psycopg.connect(url) as conn:
        ids = [
            publish(conn, topic="orders", key=key, payload={"p": p}, wakeup=False, **extra)
            for p in payloads
        ]
        conn.commit()
    record(url)
    return ids


def _relay_once(url: str, wanted: int) -> list[Envelope]:
    """Run the real relay until ``wanted`` rows are no longer pending; what it published."""
    pub = Recorder()
    config = RelayConfig(
        database_url=url, poll_interval=0.05, lease_seconds=5.0, publish_timeout=2.0,
        heartbeat_interval=0.5, shutdown_timeout=3.0, backoff_base=0.05, backoff_max=0.2,
    )  # fmt: skip

    def settled() -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM outbox_messages WHERE status <> 'pending' OR attempts > 0"
            ).fetchone()
            return int(row[0]) if row else 0

    async def go() -> None:
        relay = Relay(config, pub)
        task = asyncio.create_task(relay.run())
        for _ in range(1000):
            if settled() >= wanted:
                break
            await asyncio.sleep(0.02)
        relay.stop()
        await asyncio.wait_for(task, 15)
        assert settled() >= wanted, "the relay did not settle the messages"

    asyncio.run(go())
    return pub.sent


def _consume(url: str, consumer: str, envs: Sequence[Envelope], **kw: Any) -> list[Outcome]:
    def handler(conn: Any, msg: Any) -> None:
        if b"consumer-poison" in msg.payload:
            raise ValueError(f"cannot parse order {msg.seq}")

    with ConnectionPool(url, min_size=1, max_size=2, open=True) as pool:
        runner = HandlerRunner(pool, handler, consumer=consumer, **kw)
        return [runner.handle(env).outcome for env in envs]


def _sources(outbox_url: str, *inboxes: str) -> TraceSources:
    return TraceSources(
        TraceSource("outbox", outbox_url),
        tuple(TraceSource(f"inbox{i + 1}", u) for i, u in enumerate(inboxes)),
    )


def _trace_cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["trace", *args])


def test_published_applied_by_both_then_by_one_of_two(dbs: tuple[str, str, str]) -> None:
    outbox_url, billing_url, shipping_url = dbs
    a1, a2, a3 = _write(outbox_url, "A", ["1", "2", "3"], headers={"tenant": "acme"})
    sent = _relay_once(outbox_url, 3)
    assert [e.id for e in sent] == [a1, a2, a3]
    assert _consume(billing_url, "billing", sent, ordered=True) == [Outcome.PROCESSED] * 3
    assert _consume(shipping_url, "shipping", sent[:2], ordered=True) == [Outcome.PROCESSED] * 2

    j = trace_message(_sources(outbox_url, billing_url, shipping_url), a2)
    assert (j.topic, j.key, j.seq) == ("orders", "A", 2)
    assert j.outbox is not None
    assert j.outbox.status == "published"
    assert j.summary == "published; applied by 2 of 2 consumer(s)"
    assert not j.stuck
    assert j.actions == ()
    assert [(r.inbox, r.consumer, r.state) for r in j.inboxes] == [
        ("inbox1", "billing", "applied"),
        ("inbox2", "shipping", "applied"),
    ]
    assert all(r.since_published is not None for r in j.inboxes)
    assert j.previous is not None
    assert (j.previous.seq, j.previous.id) == (1, a1)
    assert j.next is not None
    assert (j.next.seq, j.next.status) == (3, "published")
    assert [s.what for s in j.timeline][:2] == ["committed", "published"]
    assert {s.what for s in j.timeline[2:]} == {"received", "applied"}
    published = j.timeline[1]
    assert published.after == j.outbox.published_at - j.outbox.created_at  # type: ignore[operator]

    # a3 reached billing only: shipping (a consumer of the topic) has no record
    j3 = trace_message(_sources(outbox_url, billing_url, shipping_url), a3)
    assert j3.summary == "published; applied by 1 of 2 consumer(s)"
    assert [(r.consumer, r.state) for r in j3.inboxes] == [
        ("billing", "applied"),
        ("shipping", "absent"),
    ]
    assert j3.inboxes[1].key_applied_seq == 2
    assert j3.stuck
    [action] = j3.actions
    assert "shipping has no record" in action.why
    assert action.command is not None
    assert f"echo {a3} > ids.txt && outbox redrive" in action.command

    # the same from the command line, as JSON, and in text with exit status 1 (stuck)
    args = [str(a3), "--url", outbox_url, "--inbox", billing_url, "--inbox", shipping_url]
    result = _trace_cli(*args, "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert doc["id"] == str(a3)
    assert doc["outbox"]["status"] == "published"
    assert doc["inboxes"][1]["state"] == "absent"
    assert doc["outbox"]["headers"] == {"tenant": "acme"}
    text = _trace_cli(*args)
    assert "inbox inbox2/shipping: absent" in text.output
    assert "what to do:" in text.output
    assert "outbox redrive ids.txt" in text.output

    # by topic/key/seq, and exit status 0 when nothing is wrong
    ok = _trace_cli(
        "--topic", "orders", "--key", "A", "--seq", "2", "--url", outbox_url,
        "--inbox", billing_url, "--inbox", shipping_url,
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert f"message {a2}" in ok.output
    assert "applied by 2 of 2" in ok.output


def test_pending_and_by_idempotency_key(dbs: tuple[str, str, str]) -> None:
    outbox_url, billing_url, _ = dbs
    [mid] = _write(outbox_url, "P", ["x"], idempotency_key="order-42")
    assert mid == id_from_idempotency_key("orders", "order-42")
    result = _trace_cli(
        "--idempotency-key", "order-42", "--topic", "orders", "--url", outbox_url,
        "--inbox", billing_url, "--json",
    )  # fmt: skip
    doc = json.loads(result.output)
    assert doc["id"] == str(mid)
    assert doc["summary"] == "pending: not published yet"
    assert doc["outbox"]["status"] == "pending"
    # no relay has ever run: that is what to fix
    assert result.exit_code == 1
    assert any("no relay has heartbeated" in a["why"] for a in doc["actions"])
    assert doc["inboxes"] == []  # billing has no record of any orders message
    missing = _trace_cli("--idempotency-key", "order-42", "--url", outbox_url)
    assert missing.exit_code == 2
    assert "--idempotency-key needs --topic" in missing.output


def test_dead_at_the_relay_holds_its_key(dbs: tuple[str, str, str]) -> None:
    outbox_url, _, _ = dbs
    dead, behind = _write(outbox_url, "D", ["relay-poison", "fine"])
    _relay_once(outbox_url, 1)
    j = trace_message(_sources(outbox_url), dead)
    assert j.outbox is not None
    assert j.outbox.status == "dead"
    assert j.outbox.last_error is not None
    assert "rejected by the broker" in j.outbox.last_error
    assert j.summary.startswith("dead at the relay")
    assert j.next is not None
    assert (j.next.id, j.next.status) == (behind, "pending")
    [action] = j.actions
    assert (
        action.command
        == f"outbox dead retry --id {dead} --reason ... --url {shlex.quote(outbox_url)}"
    )

    # the message behind it: pending, waiting for the dead one
    jb = trace_message(_sources(outbox_url), behind)
    assert jb.blocked_by is not None
    assert (jb.blocked_by.id, jb.blocked_by.status) == (dead, "dead")
    retry = f"outbox dead retry --id {dead} --reason ... --url {shlex.quote(outbox_url)}"
    assert jb.actions[0].command == retry
    assert "waits behind seq 1" in jb.actions[0].why


def test_dead_and_held_at_a_consumer(dbs: tuple[str, str, str]) -> None:
    outbox_url, billing_url, shipping_url = dbs
    s1, s2, s3 = _write(outbox_url, "H", ["consumer-poison", "ok", "ok"])
    [skip] = _write(outbox_url, "S", ["consumer-poison"])
    sent = _relay_once(outbox_url, 4)
    held = [e for e in sent if e.key == "H"]
    outcomes = _consume(billing_url, "billing", held, ordered=True, max_attempts=1, on_dead="hold")
    assert outcomes == [Outcome.DEAD, Outcome.PARKED, Outcome.PARKED]
    skipped = [e for e in sent if e.key == "S"]
    assert _consume(shipping_url, "shipping", skipped, max_attempts=1) == [Outcome.DEAD]

    sources = _sources(outbox_url, billing_url, shipping_url)
    j = trace_message(sources, s1)
    [billing] = [r for r in j.inboxes if r.consumer == "billing"]
    assert (billing.state, billing.held, billing.attempts) == ("dead", True, 1)
    assert billing.last_error == "ValueError: cannot parse order 1"
    assert "dead at billing" in j.summary
    # shipping reads the topic too (it has a record of key S) and never got this one
    [action, absent] = j.actions
    assert "consumer shipping has no record" in absent.why
    assert action.command == (
        f"outbox inbox dead retry --consumer billing --id {s1} --reason ... "
        f"--url {shlex.quote(billing_url)}"
    )

    jp = trace_message(sources, s3)
    [parked] = [r for r in jp.inboxes if r.consumer == "billing"]
    assert (parked.state, parked.held_by, parked.held_by_seq) == ("parked", s1, 1)
    assert "held at billing" in jp.summary
    assert jp.actions[0].command is not None
    assert f"--id {s1}" in jp.actions[0].command
    assert s2 != s3

    js = trace_message(sources, skip)
    [dead] = [r for r in js.inboxes if r.consumer == "shipping"]
    assert (dead.state, dead.held) == ("dead", False)
    assert any("on_dead='skip'" in a.why for a in js.actions)


def test_never_committed_is_not_found_with_what_it_means(dbs: tuple[str, str, str]) -> None:
    outbox_url, billing_url, _ = dbs
    with psycopg.connect(outbox_url) as conn:
        mid = publish(conn, topic="orders", key="R", payload={}, wakeup=False)
        conn.rollback()
    with pytest.raises(MessageNotFoundError, match="never committed"):
        trace_message(_sources(outbox_url, billing_url), mid)
    result = _trace_cli(str(mid), "--url", outbox_url)
    assert result.exit_code == 2
    assert "never committed" in result.output
    assert "--inbox" in result.output
    bad = _trace_cli("not-a-uuid", "--url", outbox_url)
    assert bad.exit_code == 2
    assert "is not a message id" in bad.output


def test_unreachable_inbox_is_reported_without_its_password(dbs: tuple[str, str, str]) -> None:
    outbox_url, _, _ = dbs
    [mid] = _write(outbox_url, "U", ["x"])
    _relay_once(outbox_url, 1)
    secret = "s3cr3t-Pa55word"
    down = f"postgresql://alice:{secret}@127.0.0.1:1/nowhere"
    result = _trace_cli(str(mid), "--url", outbox_url, "--inbox", down, "--json")
    assert secret not in result.output
    doc = json.loads(result.output)
    [inbox] = doc["inboxes"]
    assert inbox["state"] == "unreachable"
    assert "cannot reach the database" in inbox["error"]
    assert result.exit_code == 1
    outbox_down = _trace_cli(str(mid), "--url", down)
    assert outbox_down.exit_code == 2
    assert secret not in outbox_down.output
    assert "cannot reach the database" in outbox_down.output


def test_console_role_traces_in_a_read_only_transaction(
    dbs: tuple[str, str, str], pg_server: PgServer
) -> None:
    outbox_url, billing_url, _ = dbs
    [mid] = _write(outbox_url, "C", ["x"])
    sent = _relay_once(outbox_url, 1)
    _consume(billing_url, "billing", sent, ordered=True)
    role = f"trace_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(outbox_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        for url in (outbox_url, billing_url):
            assert CliRunner().invoke(main, [
                "migrate", "grants", "--console", role, "--apply", "--url", url,
            ]).exit_code == 0  # fmt: skip
        as_role = [u.replace("postgresql://postgres@", f"postgresql://{role}@")
                   for u in (outbox_url, billing_url)]  # fmt: skip
        assert all(role in u for u in as_role), as_role
        j = trace_message(_sources(*as_role), mid)
        assert [(r.consumer, r.state, r.key_applied_seq) for r in j.inboxes] == [
            ("billing", "applied", 1)
        ]
    finally:
        with psycopg.connect(outbox_url, autocommit=True) as conn:
            for url in (outbox_url, billing_url):
                with psycopg.connect(url, autocommit=True) as c:
                    c.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def test_the_last_reconciliation_verdict_and_the_job_file(
    dbs: tuple[str, str, str], tmp_path: Any
) -> None:
    outbox_url, billing_url, _ = dbs
    lost, fine = _write(outbox_url, "V", ["1", "2"])
    run_id = uuid.uuid4()
    with psycopg.connect(outbox_url) as conn:
        conn.execute(
            "INSERT INTO outbox_reconciliation_runs (run_id, started_at, finished_at, "
            "window_start, window_end, horizon_xmin, messages, discrepancies, outcome, summary) "
            "VALUES (%s, now(), now(), now() - interval '1 day', now() + interval '1 hour', 1, "
            "2, 1, 'failed', '{}')",
            (run_id,),
        )
        conn.commit()
    (tmp_path / str(run_id)).mkdir()
    (tmp_path / str(run_id) / "redrive.txt").write_text(f"{lost}\n")
    job = tmp_path / "job.toml"
    job.write_text(
        f'sla = "1h"\n[outbox]\nurl = "jdbc:{outbox_url}"\n'
        f'[[inbox]]\nname = "billing-db"\nurl = "{billing_url}"\n'
        "[subscriptions]\norders = ['billing']\n"
    )
    result = _trace_cli(str(lost), "--config", str(job), "--reports-dir", str(tmp_path), "--json")
    doc = json.loads(result.output)
    verdict = doc["reconciliation"]
    assert (verdict["run_id"], verdict["outcome"]) == (str(run_id), "failed")
    assert verdict["judged"]
    assert verdict["kinds"] == ["lost"]
    assert verdict["files_read"]
    ok = trace_message(_sources(outbox_url), fine, reports_dir=tmp_path)
    assert ok.reconciliation is not None
    assert ok.reconciliation.kinds == ()
    text = _trace_cli(str(lost), "--config", str(job), "--reports-dir", str(tmp_path))
    assert f"reconciliation: run {run_id} (failed" in text.output
    assert "lost" in text.output
    # without the reports, only the run's outcome
    bare = trace_message(_sources(outbox_url), lost)
    assert bare.reconciliation is not None
    assert not bare.reconciliation.files_read
    assert bare.reconciliation.note is not None
    assert "--reports-dir" in bare.reconciliation.note


def test_a_consumer_retrying_it_and_one_waiting_for_an_earlier_seq(
    dbs: tuple[str, str, str],
) -> None:
    outbox_url, billing_url, shipping_url = dbs
    w1, w2, w3 = _write(outbox_url, "W", ["ok", "ok", "consumer-poison"])
    sent = _relay_once(outbox_url, 3)
    # billing applies 1 and 2, then its handler fails on 3 (it will retry: 3 attempts allowed)
    assert _consume(billing_url, "billing", sent, ordered=True, max_attempts=3) == [
        Outcome.PROCESSED,
        Outcome.PROCESSED,
        Outcome.FAILED,
    ]
    # shipping got 1 only: 3 arrived before 2, so it was refused (out of order)
    assert _consume(shipping_url, "shipping", [sent[0], sent[2]], ordered=True) == [
        Outcome.PROCESSED,
        Outcome.OUT_OF_ORDER,
    ]
    j = trace_message(_sources(outbox_url, billing_url, shipping_url), w3)
    billing, shipping = j.inboxes
    assert (billing.state, billing.attempts) == ("retrying", 1)
    assert billing.last_error == "ValueError: cannot parse order 3"
    assert (shipping.state, shipping.key_applied_seq) == ("absent", 1)
    retrying, waiting = j.actions
    assert "redelivers it" in retrying.why
    assert retrying.command is None
    assert "waits for seq 2 first" in waiting.why
    assert waiting.command == (
        f"outbox trace --topic orders --key W --seq 2 --url {shlex.quote(outbox_url)}"
    )
    assert w1 != w2


def test_the_origin_is_on_every_message_and_in_the_trace(dbs: tuple[str, str, str]) -> None:
    """The relay puts the outbox database's origin on its messages; the consumer keeps its
    position under it; the trace (text and JSON) names it and finds that position."""
    outbox_url, billing_url, _ = dbs
    with psycopg.connect(outbox_url) as conn:
        row = conn.execute("SELECT origin FROM outbox_identity").fetchone()
    assert row is not None
    origin = row[0]
    assert origin
    [mid] = _write(outbox_url, "O", ["1"])
    sent = _relay_once(outbox_url, 1)
    assert [e.origin for e in sent] == [origin]
    assert _consume(billing_url, "billing", sent, ordered=True) == [Outcome.PROCESSED]
    j = trace_message(_sources(outbox_url, billing_url), mid)
    assert j.origin == origin
    assert [(r.consumer, r.key_applied_seq) for r in j.inboxes] == [("billing", 1)]
    text = _trace_cli(str(mid), "--url", outbox_url, "--inbox", billing_url)
    assert f"seq 1  origin {origin}" in text.output
    doc = json.loads(_trace_cli(str(mid), "--url", outbox_url, "--json").output)
    assert doc["origin"] == origin
