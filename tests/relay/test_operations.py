"""Operations: config validation, status, dead letters (audited), retention, metrics, tracing."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from outbox.cli import main
from outbox.exceptions import ConfigurationError
from relay import PermanentPublishError, Relay, RelayConfig, RelayMetrics, TopicPolicy
from relay._metrics import MetricsServer
from tests.relay.relay_helpers import FakePublisher, await_for, config, running, statuses, write


def test_config_merges_file_env_flags_and_validates(tmp_path: Path) -> None:
    f = tmp_path / "relay.toml"
    f.write_text(
        'database_url = "postgresql://file/db"\nbatch_size = 50\n'
        '[topics.payments]\nsemantics = "at-most-once"\non_dead = "skip"\n'
    )
    env = {"OUTBOX_RELAY_BATCH_SIZE": "70", "OUTBOX_RELAY_LEASE_SECONDS": "12"}
    cfg = RelayConfig.load(f, env=env, poll_interval=0.5)
    assert (cfg.database_url, cfg.batch_size, cfg.lease_seconds) == ("postgresql://file/db", 70, 12)
    assert cfg.poll_interval == 0.5
    assert cfg.policy("payments") == TopicPolicy("at-most-once", "skip", 10)
    assert cfg.policy("other").semantics == "at-least-once"


@pytest.mark.parametrize(
    ("toml", "env", "message"),
    [
        (
            'database_url = "x"\nbatch_sise = 5\n',
            {},
            "relay.toml: unknown setting 'batch_sise' (did you mean 'batch_size'",
        ),
        ('database_url = "x"\n[topics.t]\nsemantics = "exactly-once"\n', {}, "topic 't'"),
        ('database_url = "x"\n', {"OUTBOX_RELAY_BATCH_SIZE": "many"}, "OUTBOX_RELAY_BATCH_SIZE"),
        ('database_url = "x"\nlease_seconds = 5\npublish_timeout = 9\n', {}, "shorter than"),
        ("batch_size = 5\n", {}, "no database URL"),
        ("database_url = [", {}, "not valid TOML"),
        ('database_url = "x"\nretention_seconds = "7d"\n', {}, "retention_seconds must be"),
        ('database_url = "x"\nlisten = "false"\n', {}, "listen must be true or false"),
        ('database_url = "x"\nmetrics_port = "abc"\n', {}, "metrics_port must be a TCP port"),
        ('database_url = "x"\nmetrics_port = 70000\n', {}, "metrics_port must be a TCP port"),
        ('database_url = "x"\nlease_seconds = nan\n', {}, "lease_seconds must be a finite"),
        ('database_url = "x"\npoll_interval = inf\n', {}, "poll_interval must be a finite"),
        ('database_url = "x"\nbatch_size = true\n', {}, "batch_size must be an integer"),
        ('database_url = "x"\nbatch_size = 2.5\n', {}, "batch_size must be an integer"),
        ('database_url = "x"\nrelay_id = 7\n', {}, "relay_id must be a string"),
        ('database_url = "x"\nbroker_url = 7\n', {}, "broker_url must be a string"),
        ('database_url = "x"\n[topics.t]\nmax_attempts = true\n', {}, "max_attempts must be"),
        ('database_url = "x"\n[default]\nsemantics = "effectively-once"\n', {}, "dedup"),
        ('database_url = "x"\n', {"OUTBOX_RELAY_LEASE_SECONDS": "nan"}, "lease_seconds must"),
        ('database_url = "x"\n', {"OUTBOX_RELAY_LISTEN": "maybe"}, "OUTBOX_RELAY_LISTEN"),
        ('database_url = "x"\nwatch = "on"\n', {}, "watch must be true or false"),
        ('database_url = "x"\nwatch_interval = 0\n', {}, "watch_interval must be a finite"),
        (
            'database_url = "x"\nwatch_interval = 0.1\nwatch_idle_interval = 0.05\n',
            {},
            "watch_idle_interval must be a number of seconds >= watch_interval (0.1)",
        ),
    ],
)
def test_config_errors_name_the_setting(
    tmp_path: Path, toml: str, env: dict[str, str], message: str
) -> None:
    f = tmp_path / "relay.toml"
    f.write_text(toml)
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RelayConfig.load(f, env=env)


def _dead(url: str) -> None:
    """Three dead messages: t/a#1 (held: a#2 waits), t/b#1, u/c#1."""
    write(url, [("t", "a"), ("t", "a"), ("t", "b"), ("u", "c")])
    pub = FakePublisher()
    pub.fail = lambda e: PermanentPublishError("rejected") if e.seq == 1 else None

    async def go() -> None:
        async with running(Relay(config(url), pub)):
            await await_for(lambda: statuses(url).get("dead") == 3, what="dead letters")

    asyncio.run(go())


def test_cli_dead_list_retry_purge_with_dry_run_and_audit(url: str) -> None:
    _dead(url)
    run = CliRunner().invoke
    out = run(main, ["dead", "list", "--url", url, "--topic", "t"])
    assert out.exit_code == 0, out.output
    assert out.output.count("rejected") == 2
    assert run(main, ["dead", "retry", "--url", url]).exit_code == 2  # no filter, no --all
    dry = run(main, ["dead", "retry", "--url", url, "--key", "a", "--dry-run"])
    assert dry.exit_code == 0
    assert statuses(url)["dead"] == 3
    done = run(
        main,
        [
            "dead",
            "retry",
            "--url",
            url,
            "--key",
            "a",
            "--reason",
            "fixed schema",
            "--actor",
            "alice",
        ],
    )
    assert done.exit_code == 0, done.output
    purged = run(main, ["dead", "purge", "--url", url, "--topic", "u", "--actor", "bob"])
    assert purged.exit_code == 0, purged.output
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT key, seq, status, attempts FROM outbox_messages ORDER BY key, seq"
        ).fetchall()
        audit = conn.execute(
            "SELECT actor, action, key, reason FROM outbox_dead_audit ORDER BY id"
        ).fetchall()
    assert rows == [("a", 1, "pending", 0), ("a", 2, "pending", 0), ("b", 1, "dead", 1)]
    assert audit == [("alice", "retry", "a", "fixed schema"), ("bob", "purge", "c", None)]
    shown = run(main, ["dead", "show", str(_id_of(url, "b")), "--url", url])
    assert json.loads(shown.output)["last_error"].endswith("rejected")
    log = run(main, ["dead", "audit", "--url", url])
    assert "alice  retry" in log.output


def test_dead_retry_and_purge_wake_relays_at_commit(url: str) -> None:
    from outbox import WAKEUP_CHANNEL
    from relay.admin import DeadFilter, dead_purge, dead_retry

    _dead(url)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {WAKEUP_CHANNEL}")

        def woken() -> int:
            return sum(1 for _ in listener.notifies(timeout=2, stop_after=1))

        assert dead_retry(url, DeadFilter(key="a"), actor="alice")
        assert woken() == 1  # the relays need not wait for their fallback poll
        assert dead_purge(url, DeadFilter(topic="u"), actor="bob")
        assert woken() == 1
        assert dead_retry(url, DeadFilter(key="nobody"), actor="alice") == []
        assert woken() == 0  # nothing changed, nobody woken


def _id_of(url: str, key: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT id FROM outbox_messages WHERE key = %s", [key]).fetchone()
    assert row is not None
    return row[0]


def test_cli_status_shows_backlog_dead_and_relays(url: str) -> None:
    write(url, [("t", "a")] * 3)
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE outbox_messages SET status = 'dead' WHERE seq = 3")
        conn.execute("INSERT INTO outbox_relays (relay_id, hostname, pid) VALUES ('r-1', 'h', 42)")
        conn.execute(
            "UPDATE outbox_messages SET lease_owner = 'r-1', lease_token = gen_random_uuid(), "
            "lease_until = now() + interval '1 minute' WHERE seq = 1"
        )
    out = CliRunner().invoke(main, ["status", "--url", url, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    [topic] = data["topics"]
    assert (topic["topic"], topic["pending"], topic["leased"], topic["dead"]) == ("t", 2, 1, 1)
    assert topic["oldest_pending_s"] >= 0
    [relay] = data["relays"]
    assert (relay["relay_id"], relay["leased"], relay["topics"]) == ("r-1", 1, ["t"])


def test_cli_retention_deletes_only_old_published_rows(url: str) -> None:
    write(url, [("t", "a")] * 5)
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE outbox_messages SET status = 'published', published_at = now() - "
            "interval '2 hours' WHERE seq <= 3"
        )
        conn.execute(
            "UPDATE outbox_messages SET status = 'published', published_at = now() WHERE seq = 4"
        )
    out = CliRunner().invoke(
        main, ["retention", "--url", url, "--older-than", "3600", "--batch", "2"]
    )
    assert out.exit_code == 0, out.output
    assert "deleted 3" in out.output
    assert statuses(url) == {"published": 1, "pending": 1}


def test_cli_relay_without_broker_is_a_clear_error(url: str) -> None:
    out = CliRunner().invoke(main, ["relay", "--url", url])
    assert out.exit_code == 2
    assert "no broker" in out.output


def test_metrics_and_health_endpoints(url: str) -> None:
    write(url, [("t", "a")] * 3)
    metrics = RelayMetrics.prometheus()
    relay = Relay(config(url), FakePublisher(), metrics=metrics)
    server = MetricsServer(metrics, lambda: relay.last_db_ok > 0, "127.0.0.1", 0)
    server.start()

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}") as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            e.close()
            return e.code, ""

    async def go() -> None:
        assert (await asyncio.to_thread(get, "/healthz"))[0] == 503
        async with running(relay):
            await await_for(lambda: statuses(url) == {"published": 3}, what="published")
            await await_for(lambda: get("/healthz")[0] == 200, what="healthy")
            text = await asyncio.to_thread(lambda: get("/metrics")[1])
            assert 'outbox_relay_published_total{topic="t"} 3.0' in text
            assert "outbox_relay_batch_seconds_count" in text

    try:
        asyncio.run(go())
    finally:
        server.close()


def test_publish_span_links_to_stored_traceparent(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from relay import _tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    producer_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{producer_trace}-00f067aa0ba902b7-01"
    write(url, [("t", "a")], headers=None)
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE outbox_messages SET traceparent = %s", [traceparent])
    tracer = provider.get_tracer("test")
    # the process-wide provider can be set only once: patch the lookups instead (undone after)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(trace, "get_tracer", lambda name: tracer)
    assert _tracing.trace is trace

    async def go() -> None:
        async with running(Relay(config(url), FakePublisher())):
            await await_for(lambda: statuses(url) == {"published": 1}, what="published")

    asyncio.run(go())
    [span] = exporter.get_finished_spans()
    assert span.name == "outbox publish"
    assert [format(link.context.trace_id, "032x") for link in span.links] == [producer_trace]


def test_heartbeat_and_latest_reconciliation_gauges(url: str) -> None:
    """Every heartbeat stamps its time and exports the latest recorded reconciliation run (the
    alert rules' inputs, docs/how-to/alerts.md); before any run its time is 0."""
    metrics = RelayMetrics.prometheus()
    relay = Relay(config(url), FakePublisher(), metrics=metrics)

    def sample(name: str) -> float | None:
        value: float | None = metrics.registry.get_sample_value(name)
        return value

    async def beats_after(started: float) -> None:
        await await_for(
            lambda: (sample("outbox_relay_heartbeat_timestamp_seconds") or 0) > started,
            what="a heartbeat",
        )

    async def go() -> None:
        async with running(relay):
            await beats_after(time.time())
            assert sample("outbox_reconciliation_last_run_timestamp_seconds") == 0
            with psycopg.connect(url, autocommit=True) as conn:
                for finished, outcome, found in (("1 hour", "ok", 0), ("10 minutes", "failed", 4)):
                    conn.execute(
                        "INSERT INTO outbox_reconciliation_runs (run_id, started_at, finished_at, "
                        "window_start, window_end, horizon_xmin, messages, discrepancies, "
                        "outcome, summary) VALUES (gen_random_uuid(), now() - %s::interval, "
                        "now() - %s::interval, now() - interval '1 day', now(), 1, 10, %s, %s, "
                        "'{}')",
                        (finished, finished, found, outcome),
                    )
            await beats_after(time.time())
            await beats_after(time.time())  # a whole heartbeat after the rows were committed

    asyncio.run(go())
    finished = sample("outbox_reconciliation_last_run_timestamp_seconds")
    assert finished is not None
    assert 500 < time.time() - finished < 700  # the latest run: 10 minutes ago
    assert sample("outbox_reconciliation_last_run_failed") == 1
    assert sample("outbox_reconciliation_last_run_discrepancies") == 4


def test_a_drained_topics_backlog_gauges_go_to_zero(url: str) -> None:
    """A topic with every row published has no row in the status query; its gauges must not
    keep their last value (a backlog alert would never resolve)."""
    from relay._statements import relay_statements

    metrics = RelayMetrics.prometheus()
    stmts = relay_statements(None)
    write(url, [("t", "a"), ("t", "b")])

    def gauge(name: str) -> float | None:
        value: float | None = metrics.registry.get_sample_value(name, {"topic": "t"})
        return value

    async def go() -> tuple[tuple[float | None, ...], tuple[float | None, ...]]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await metrics.refresh_backlog(conn, stmts)
            before = (gauge("outbox_backlog"), gauge("outbox_oldest_pending_seconds"))
            await conn.execute(
                "UPDATE outbox_messages SET status = 'published', published_at = now()"
            )
            await metrics.refresh_backlog(conn, stmts)
            after = (gauge("outbox_backlog"), gauge("outbox_oldest_pending_seconds"))
            return before, after

    before, after = asyncio.run(go())
    assert before[0] == 2
    assert (before[1] or 0) > 0
    assert after == (0, 0)
