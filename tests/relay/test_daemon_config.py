"""The relay as an operator deploys it: everything from its TOML file and OUTBOX_* variables.

* The ``[broker]`` table (and ``OUTBOX_BROKER_<OPTION>``) builds the publisher: destinations,
  the NATS stream and its creation, Kafka client settings, TLS files; a bad option is one line.
* ``outbox relay check`` says per topic where it would publish and whether that exists.
* The daemon says what it does: one line at start, one at a clean stop, none for a relay that
  never started; an unreachable broker is reported at once, not per reconnect attempt, shows
  in ``outbox status``, and SIGTERM still ends it within ``shutdown_timeout``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from relay import RelayConfig
from relay._broker_config import OPTION_HELP, options_for
from relay.brokers import SCHEMES
from relay.cli import make_publisher
from tests.relay.relay_helpers import statuses, wait_for, write
from tests.support.nats_server import PrivateNats
from tests.support.server_process import free_port
from tests.support.services import import_or_missing

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _run(*argv: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OUTBOX, *argv], capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, **env},
    )  # fmt: skip


def _toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- the [broker] table builds the publisher (pure logic) ----------------------------------


def test_the_broker_table_and_variables_build_the_publisher(tmp_path: Path) -> None:
    import_or_missing("nats", "nats")
    cfg = _toml(tmp_path / "relay.toml", """
database_url = "postgresql://app@db/app"
[broker]
url = "nats://127.0.0.1:4222"
stream = "ORDERS"
stream_subjects = ["orders.>"]
create_stream = true
duplicate_window = 300
max_in_flight = 100
[broker.destinations]
orders = "orders.created"
"*" = "orders.{topic}"
""")  # fmt: skip
    config = RelayConfig.load(cfg, env={"OUTBOX_BROKER_MAX_IN_FLIGHT": "50"})
    pub: Any = make_publisher(config)
    assert type(pub).__name__ == "NatsPublisher"
    assert (pub._stream, pub._stream_subjects, pub._create_stream) == ("ORDERS", ["orders.>"], True)
    assert pub._duplicate_window == 300
    assert pub._max_in_flight == 50  # the variable wins over the file
    assert pub._destination("orders") == "orders.created"
    assert pub._destination("payments") == "orders.payments"
    # the variables alone, with no file
    env = {
        "OUTBOX_DATABASE_URL": "postgresql://app@db/app",
        "OUTBOX_BROKER_URL": "nats://127.0.0.1:4222",
        "OUTBOX_BROKER_STREAM": "S",
        "OUTBOX_BROKER_STREAM_SUBJECTS": "a.>,b.>",
        "OUTBOX_BROKER_CREATE_STREAM": "true",
        "OUTBOX_BROKER_DESTINATIONS": "orders=a.orders,*=b.{topic}",
    }
    pub = make_publisher(RelayConfig.load(env=env))
    assert (pub._stream, pub._stream_subjects, pub._create_stream) == ("S", ["a.>", "b.>"], True)
    assert (pub._destination("orders"), pub._destination("x")) == ("a.orders", "b.x")


def test_kafka_client_settings_and_tls_files_reach_librdkafka(tmp_path: Path) -> None:
    import_or_missing("confluent_kafka", "kafka")
    ca = tmp_path / "ca.pem"
    ca.write_text("not read until a connection is made")
    cfg = _toml(tmp_path / "relay.toml", """
database_url = "postgresql://app@db/app"
[broker]
url = "kafka://127.0.0.1:9092"
[broker.config]
"linger.ms" = 20
"client.id" = "relay-1"
""")  # fmt: skip
    config = RelayConfig.load(cfg, env={"OUTBOX_BROKER_TLS_CA": str(ca)})
    pub: Any = make_publisher(config)
    assert pub._config["linger.ms"] == 20
    assert pub._config["client.id"] == "relay-1"
    assert pub._config["ssl.ca.location"] == str(ca)
    assert pub._config["security.protocol"] == "SSL"


@pytest.mark.parametrize(
    ("broker", "env", "expected"),
    [
        ('url = "nats://127.0.0.1:4222"\nstreams = "S"', {},
         "[broker]: unknown nats:// option 'streams' (did you mean 'stream'?)"),
        ('url = "nats://127.0.0.1:4222"\ncreate_stream = "yes"', {},
         "[broker]: create_stream must be true or false, got 'yes'"),
        ('url = "kafka://127.0.0.1:9092"\nstream = "S"', {},
         "[broker]: unknown kafka:// option 'stream'"),
        ('url = "nats://127.0.0.1:4222"\ntls_ca = "/nonexistent/ca.pem"', {},
         "[broker]: tls_ca file /nonexistent/ca.pem does not exist"),
        ('url = "nats://127.0.0.1:4222"', {"OUTBOX_BROKER_DUPLICATE_WINDOW": "soon"},
         "OUTBOX_BROKER_DUPLICATE_WINDOW='soon' is not a valid float"),
        ('url = "nats://127.0.0.1:4222"', {"OUTBOX_BROKER_STREEM": "S"},
         "OUTBOX_BROKER_STREEM: unknown nats:// option 'streem' (did you mean 'stream'?)"),
    ],
    ids=["unknown option", "wrong kind", "another broker's option", "missing TLS file",
         "bad variable", "unknown variable"],
)  # fmt: skip
def test_a_bad_broker_setting_is_one_line_at_start(
    tmp_path: Path, broker: str, env: dict[str, str], expected: str
) -> None:
    cfg = _toml(tmp_path / "relay.toml",
                f'database_url = "postgresql://nowhere/db"\n[broker]\n{broker}\n')  # fmt: skip
    done = _run("relay", "--config", str(cfg), **env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert expected in lines[0]


def test_every_option_of_every_adapter_says_what_it_means() -> None:
    for scheme in SCHEMES:
        for name, option in options_for(scheme).items():
            assert option.help, f"{scheme}:// option {name}: add a line to OPTION_HELP"
    assert {"stream", "create_stream", "config", "tls_ca", "endpoint_url"} <= set(OPTION_HELP)
    page = (Path(__file__).parents[2] / "docs/reference/relay-settings.md").read_text()
    for scheme in SCHEMES:
        assert f"`{scheme}:" in page, f"the settings reference does not list {scheme}"


def test_relay_help_names_every_scheme() -> None:
    done = _run("relay", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for scheme in SCHEMES:
        if scheme == "memory":  # the tests' broker
            continue
        assert f" {scheme}:" in text, f"outbox relay --help does not name {scheme}"


# ---- a relay configured only by its file, on a fresh broker --------------------------------


def _start_relay(cfg: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [OUTBOX, "relay", "--config", str(cfg)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
        )  # fmt: skip


def _stop_relay(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM; the seconds it took to exit."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - started


async def _stored(url: str, stream: str) -> list[tuple[str, bytes]]:
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            found.append((msg.subject, msg.data or b""))
        return found
    finally:
        await nc.close()


def test_a_relay_configured_by_its_file_alone_creates_the_stream_and_publishes(
    url: str, tmp_path: Path
) -> None:
    import_or_missing("nats", "nats")
    relay_id = f"file-only-{uuid.uuid4().hex[:6]}"
    write(url, [("orders", "o-1"), ("orders", "o-2")])
    with PrivateNats(tmp_path / "js") as nats_server:
        cfg = _toml(tmp_path / "relay.toml", f"""
[relay]
database_url = "{url}"
relay_id = "{relay_id}"
poll_interval = 0.2

[broker]
url = "{nats_server.url}"
stream = "SHOP"
stream_subjects = ["shop.>"]
create_stream = true

[broker.destinations]
orders = "shop.orders.placed"
""")  # fmt: skip
        log = tmp_path / "relay.log"
        env = {k: "" for k in os.environ if k.startswith("OUTBOX_")}  # the file alone
        proc = _start_relay(cfg, log, **env)
        try:
            wait_for(lambda: statuses(url).get("published") == 2, 30, "both published")
        finally:
            took = _stop_relay(proc)
        stored = asyncio.run(_stored(nats_server.url, "SHOP"))
    assert [subject for subject, _ in stored] == ["shop.orders.placed"] * 2
    lines = log.read_text().splitlines()
    started = [line for line in lines if f"relay {relay_id} started" in line]
    assert len(started) == 1, lines
    assert "mode polling" in started[0]
    assert f"broker {nats_server.url}" in started[0]
    assert "orders -> shop.orders.placed" in started[0]
    assert [line for line in lines if f"relay {relay_id} stopped" in line], lines
    assert proc.returncode == 0
    assert took < 15


def test_a_second_relay_from_its_file_publishes_to_the_kafka_topic_it_names(
    url: str, tmp_path: Path
) -> None:
    import_or_missing("confluent_kafka", "kafka")
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.support.kafka_broker import bootstrap

    server = bootstrap()
    topic = f"billing-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": server})  # kept: the result needs its handle
    (created,) = admin.create_topics([NewTopic(topic, 1, 1)]).values()
    created.result(10)
    write(url, [("invoices", "i-1")])
    cfg = _toml(tmp_path / "relay.toml", f"""
database_url = "{url}"
poll_interval = 0.2
[broker]
url = "kafka://{server}"
[broker.config]
"client.id" = "outbox-relay-b"
[broker.destinations]
invoices = "{topic}"
""")  # fmt: skip
    checked = _run("relay", "check", "--config", str(cfg))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"topic invoices -> {topic}: ok, topic {topic}, 1 partition(s)" in checked.stdout
    unmapped = f"unmapped-{uuid.uuid4().hex[:6]}"
    missing = _run("relay", "check", "--config", str(cfg), "--topic", unmapped)
    assert missing.returncode == 1
    assert f"topic {unmapped} -> {unmapped}: MISSING: Kafka topic '{unmapped}'" in missing.stdout
    # the check created nothing
    assert unmapped not in admin.list_topics(timeout=10).topics
    proc = _start_relay(cfg, tmp_path / "relay.log")
    try:
        wait_for(lambda: statuses(url).get("published") == 1, 30, "published")
    finally:
        _stop_relay(proc)
    consumer = Consumer({"bootstrap.servers": server, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        record = None
        while record is None and time.monotonic() < deadline:
            record = consumer.poll(0.5)
        assert record is not None
        assert record.error() is None
        assert record.key() == b"i-1"
    finally:
        consumer.close()


# ---- outbox relay check ---------------------------------------------------------------------


def _check_config(tmp_path: Path, url: str, broker: str, extra: str = "") -> Path:
    return _toml(tmp_path / "check.toml", f"""
database_url = "{url}"
[broker]
url = "{broker}"
{extra}
[broker.destinations]
orders = "shop.orders"
""")  # fmt: skip


def test_relay_check_lists_each_topics_destination_and_exits_0(url: str, tmp_path: Path) -> None:
    import_or_missing("nats", "nats")
    write(url, [("payments", "p-1")])
    with PrivateNats(tmp_path / "js") as nats_server:
        extra = 'stream = "SHOP"\nstream_subjects = ["shop.>", "payments"]\ncreate_stream = true'
        cfg = _check_config(tmp_path, url, nats_server.url, extra)
        done = _run("relay", "check", "--config", str(cfg))
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert "stream SHOP does not exist yet: the relay creates it at start" in out
        assert "topic orders -> shop.orders: ok, stream SHOP (created at start)" in out
        assert "topic payments -> payments: ok, stream SHOP (created at start)" in out
        # it created nothing and published nothing
        assert statuses(url) == {"pending": 1}
        # once the relay made the stream, the check finds it
        import nats

        async def make() -> None:
            nc = await nats.connect(nats_server.url)
            await nc.jetstream().add_stream(name="SHOP", subjects=["shop.>", "payments"])
            await nc.close()

        asyncio.run(make())
        done = _run("relay", "check", "--config", str(cfg))
        assert done.returncode == 0, done.stdout
        assert "topic orders -> shop.orders: ok, stream SHOP" in done.stdout


def test_relay_check_exits_1_with_one_line_per_problem(url: str, tmp_path: Path) -> None:
    import_or_missing("nats", "nats")
    with PrivateNats(tmp_path / "js") as plain:
        # a topic no stream covers
        done = _run("relay", "check", "--config", str(_check_config(tmp_path, url, plain.url)))
        assert done.returncode == 1
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("topic orders")]
        assert "MISSING: no JetStream stream covers subject 'shop.orders'" in line
        # a configured stream that does not exist (and create_stream is off)
        cfg = _check_config(tmp_path, url, plain.url, 'stream = "NOPE"')
        done = _run("relay", "check", "--config", str(cfg))
        assert done.returncode == 1
        assert "FAILED: JetStream stream 'NOPE' does not exist" in done.stdout
    with PrivateNats(tmp_path / "js2", user="relay", password="right-one") as locked:
        wrong = locked.url.replace("nats://", "nats://relay:wrong-one@")
        done = _run("relay", "check", "--config", str(_check_config(tmp_path, url, wrong)))
        assert done.returncode == 1
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("broker")]
        assert "FAILED" in line
        assert "wrong-one" not in done.stdout + done.stderr
        assert "uthoriz" in line  # nats: 'Authorization Violation'
    closed = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = _run("relay", "--check", "--config", str(_check_config(tmp_path, url, closed)))
    assert done.returncode == 1
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("broker")]
    assert "FAILED: cannot connect to NATS" in line
    assert "ConnectionRefusedError" in line
    assert time.monotonic() - started < 15


# ---- what the daemon says ---------------------------------------------------------------------


def test_a_relay_refused_for_its_id_prints_no_stopped_line(url: str, tmp_path: Path) -> None:
    relay_id = f"dup-{uuid.uuid4().hex[:6]}"
    text = f'database_url = "{url}"\nbroker = "memory:"\nrelay_id = "{relay_id}"\n'
    cfg = _toml(tmp_path / "relay.toml", text)
    first = _start_relay(cfg, tmp_path / "first.log")
    try:
        wait_for(lambda: "started" in (tmp_path / "first.log").read_text(), 30, "first relay")
        done = _run("relay", "--config", str(cfg))
    finally:
        _stop_relay(first)
    assert done.returncode == 2
    assert "is in use by a live relay" in done.stderr
    assert "stopped" not in done.stderr
    assert "started" not in done.stderr


def test_an_unreachable_broker_is_said_at_once_shown_in_status_and_sigterm_is_prompt(
    url: str, tmp_path: Path
) -> None:
    import_or_missing("nats", "nats")
    relay_id = f"down-{uuid.uuid4().hex[:6]}"
    closed = f"nats://127.0.0.1:{free_port()}"
    cfg = _toml(tmp_path / "relay.toml", f"""
database_url = "{url}"
relay_id = "{relay_id}"
heartbeat_interval = 0.5
shutdown_timeout = 3
broker = "{closed}"
""")  # fmt: skip
    log = tmp_path / "relay.log"
    proc = _start_relay(cfg, log)
    try:
        wait_for(lambda: "connecting to the broker failed" in log.read_text(), 20, "the reason")

        def unreachable_in_status() -> bool:
            out = _run("status", "--url", url).stdout
            return f"{closed}, UNREACHABLE since" in out and "ConnectionRefusedError" in out

        wait_for(unreachable_in_status, 20, "outbox status to show the broker unreachable")
        # the relay has retried many times by now: the reason was said once
        with psycopg.connect(url) as conn:
            silent = conn.execute(
                "SELECT config->>'broker_since' FROM outbox_relays WHERE relay_id = %s",
                (relay_id,),
            ).fetchone()
        assert silent is not None
        assert silent[0]
    finally:
        took = _stop_relay(proc)
    text = log.read_text()
    assert text.count("connecting to the broker failed") == 1, text
    assert "NATS connection error" not in text, text
    assert took < 3 + 2, f"SIGTERM took {took:.1f}s with shutdown_timeout 3"
    assert f"relay {relay_id} stopped" in text


def test_outbox_help_groups_the_commands_by_task_and_says_where_to_start() -> None:
    done = _run("--help")
    assert done.returncode == 0
    text = done.stdout
    sections = [line for line in text.splitlines() if line in
                ("Set up:", "Run:", "Operate:", "Reconcile:")]  # fmt: skip
    assert sections == ["Set up:", "Run:", "Operate:", "Reconcile:"]
    listing = text[text.index("Set up:") :]
    order = [listing.index(s) for s in ("\n  migrate ", "Run:", "\n  relay ", "Operate:",
                                        "\n  status ", "Reconcile:", "\n  reconcile ")]  # fmt: skip
    assert order == sorted(order)
    flat = " ".join(text.split())
    assert "Start with `outbox migrate upgrade" in flat
    assert "docs/README.md" in flat
    assert "..." not in listing  # no description cut short
    assert "Other:" not in text  # every command has its section


def test_relay_check_finds_rabbitmq_exchanges_and_queues(url: str, tmp_path: Path) -> None:
    import_or_missing("aio_pika", "rabbitmq")
    from tests.support.services import require_port

    require_port(5672, "RabbitMQ")
    cfg = _toml(tmp_path / "rabbit.toml", f"""
database_url = "{url}"
[broker]
url = "amqp://guest:guest@127.0.0.1:5672/"
[broker.destinations]
orders = "amq.topic/orders.created"
payments = "no-such-exchange-i39/payments"
refunds = "no-such-queue-i39"
""")  # fmt: skip
    done = _run("relay", "check", "--config", str(cfg))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert (
        "topic orders -> amq.topic/orders.created: ok, exchange amq.topic, routing key "
        "orders.created" in lines
    ), lines
    assert any(
        line.startswith("topic payments -> no-such-exchange-i39/payments: MISSING: exchange "
                        "'no-such-exchange-i39' does not exist")
        for line in lines
    ), lines  # fmt: skip
    assert any(
        line.startswith("topic refunds -> no-such-queue-i39: MISSING: queue 'no-such-queue-i39'")
        for line in lines
    ), lines
    assert "guest:guest" not in done.stdout + done.stderr
