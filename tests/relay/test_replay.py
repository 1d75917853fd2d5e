"""``outbox replay`` live: 10,000 messages are published before a consumer exists; the consumer
starts (reading its live destination and its replay destination), ``outbox replay`` sends it
the history while the relay goes on publishing live traffic, and the consumer's inbox applies
every message once, each key in order. On NATS JetStream and on Redis streams. Then: an
interrupted replay continues from its cursor; the audit; the errors."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, BrokerConsumer, NatsConsumer, RedisStreamConsumer
from outbox import ConfigurationError, Message, publish_batch
from outbox.cli import main
from outbox.envelope import Envelope
from relay import Relay, ReplayError, RetryablePublishError, replay
from relay.brokers import publisher_for_url
from tests.relay.relay_helpers import FakePublisher, config, running
from tests.support.harness import PgServer
from tests.support.services import require_port

TOPIC = "orders"
KEYS = 200
PER_KEY = 50  # 200 keys x 50 = the 10,000 messages of the issue
EFFECTS = """
CREATE TABLE effects (
    n bigserial PRIMARY KEY, message_id uuid NOT NULL, key text NOT NULL, seq bigint NOT NULL
)
"""


@pytest.fixture
def inbox_url(pg_server: PgServer, template_db: str) -> Iterator[str]:
    with pg_server.fresh_database(template=template_db) as url:
        with psycopg.connect(url) as conn:
            conn.execute(EFFECTS)
        yield url


def _write_history(url: str, keys: range, per_key: int) -> None:
    """``per_key`` messages on each key, committed a thousand at a time."""
    msgs = [
        Message(topic=TOPIC, key=f"k{k:03d}", payload={"k": k, "i": i})
        for i in range(per_key)
        for k in keys
    ]
    with psycopg.connect(url) as conn:
        for start in range(0, len(msgs), 1000):
            publish_batch(conn, msgs[start : start + 1000], wakeup=False)
            conn.commit()


def _published(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE status = 'published'"
        ).fetchone()
        return int(row[0]) if row else 0


async def _until(predicate: Any, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _publish_history(url: str) -> None:
    """The history: the real relay publishes it (to a broker nobody reads any more)."""

    async def go() -> None:
        async with running(Relay(config(url, batch_size=1000), FakePublisher())):
            await _until(lambda: _published(url) == KEYS * PER_KEY, 120, "the history")

    asyncio.run(go())


async def _apply(conn: psycopg.AsyncConnection[Any], messages: Sequence[Any]) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO effects (message_id, key, seq) VALUES (%s, %s, %s)",
            [(m.id, m.key, m.seq) for m in messages],
        )


class _Live:
    """Live traffic during the replay: a message on a history key and on a new key, every
    50 ms, committed by a producer while the live relay publishes them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: list[uuid.UUID] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        async with await psycopg.AsyncConnection.connect(self.url) as conn:
            while not self.stop.is_set():
                from outbox import publish_batch_async

                msgs = [
                    Message(topic=TOPIC, key=f"k{n % KEYS:03d}", payload={"live": n}),
                    Message(topic=TOPIC, key=f"new{n % 7}", payload={"live": n}),
                ]
                self.ids += await publish_batch_async(conn, msgs)
                await conn.commit()
                n += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.05)


class _Nats:
    name, port = "nats", 4222
    url = "nats://127.0.0.1:4222"

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.live = f"replaytest.{tag}.live"
        self.replay = f"replaytest.{tag}.replay.late"
        self.stream = f"REPLAYTEST_{tag}"

    async def setup(self) -> None:
        import nats

        self.nc = await nats.connect(self.url)
        self.js = self.nc.jetstream()
        await self.js.add_stream(name=self.stream, subjects=[self.live, self.replay])

    def live_publisher(self) -> Any:
        return publisher_for_url(self.url, destinations={TOPIC: self.live}, ack_timeout=1.5)

    def consumers(self, runner: AsyncHandlerRunner, batching: Batching) -> list[BrokerConsumer]:
        # one durable reads both subjects of the consumer's stream
        return [
            NatsConsumer(
                runner, stream=self.stream, durable="late", servers=self.url, batch=200,
                fetch_timeout=0.5, redeliver_delay=0.1, batching=batching,
            )
        ]  # fmt: skip

    async def teardown(self) -> None:
        await self.js.delete_stream(self.stream)
        await self.nc.close()


class _Redis:
    name, port = "redis", 6379
    url = "redis://127.0.0.1:6379/0"

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.live = f"replaytest-{tag}-live"
        self.replay = f"replaytest-{tag}-replay-late"

    async def setup(self) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(self.url)

    def live_publisher(self) -> Any:
        return publisher_for_url(self.url, destinations={TOPIC: self.live}, ack_timeout=1.5)

    def consumers(self, runner: AsyncHandlerRunner, batching: Batching) -> list[BrokerConsumer]:
        # a stream per destination: the consumer reads both, into one inbox. Entries wait in
        # the workers' buffers while the history is applied: a claim_idle_ms below that wait
        # would hand them out again (harmless duplicates, wasted work)
        return [
            RedisStreamConsumer(
                runner, stream=stream, group="late", name="late-1", url=self.url, batch=200,
                block_ms=200, claim_idle_ms=5000, batching=batching,
            )
            for stream in (self.live, self.replay)
        ]  # fmt: skip

    async def teardown(self) -> None:
        await self.client.delete(self.live, self.replay)
        await self.client.aclose()


BROKERS = {"nats": _Nats, "redis": _Redis}


@contextlib.asynccontextmanager
async def _consuming(consumers: Sequence[BrokerConsumer]) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(c.run()) for c in consumers]
    try:
        await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in consumers)), 30)
        yield
    finally:
        for c in consumers:
            c.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


def _effects(url: str) -> list[tuple[uuid.UUID, str, int]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1], r[2])
            for r in conn.execute("SELECT message_id, key, seq FROM effects ORDER BY n")
        ]


def _applied_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM effects").fetchone()
        return int(row[0]) if row else 0


@pytest.mark.parametrize("broker_name", sorted(BROKERS))
def test_a_late_consumer_gets_the_whole_history_once_in_key_order_during_live_traffic(
    broker_name: str, url: str, inbox_url: str
) -> None:
    broker = BROKERS[broker_name]()
    require_port(broker.port, broker_name)
    _write_history(url, range(KEYS), PER_KEY)
    _publish_history(url)
    with psycopg.connect(url) as conn:
        history = {r[0] for r in conn.execute("SELECT id FROM outbox_messages")}
    assert len(history) == KEYS * PER_KEY

    async def go() -> tuple[list[uuid.UUID], list[str]]:
        await broker.setup()
        progress: list[str] = []
        try:
            async with AsyncConnectionPool(inbox_url, min_size=1, max_size=4) as pool:
                runner = AsyncHandlerRunner(pool, batch_handler=_apply, consumer="late",
                                            ordered=True)  # fmt: skip
                batching = Batching(size=200, wait=0.01, workers=2)
                live = _Live(url)
                live_relay = Relay(config(url, batch_size=200), broker.live_publisher())
                async with _consuming(broker.consumers(runner, batching)), running(live_relay):
                    producer = asyncio.create_task(live.run())
                    await _until(lambda: len(live.ids) >= 20, 30, "live traffic")
                    result = await replay(
                        url, broker.url, topic=TOPIC, consumer="late",
                        destination=broker.replay, rate=20_000, batch=1000,
                        reason="onboarding late",
                        on_progress=lambda p: progress.append(f"{p.sent}/{p.total}"),
                    )  # fmt: skip
                    assert result.sent >= KEYS * PER_KEY
                    assert not result.resumed
                    live.stop.set()
                    await producer
                    everything = len(history) + len(live.ids)
                    await _until(
                        lambda: _applied_count(inbox_url) >= everything, 240,
                        f"the consumer to apply {everything} messages",
                    )  # fmt: skip
                    await _until(lambda: _published(url) == everything, 30, "live relay")
                return live.ids, progress
        finally:
            await broker.teardown()

    live_ids, progress = asyncio.run(go())
    applied = _effects(inbox_url)
    ids = [a[0] for a in applied]
    assert len(ids) == len(set(ids)), "a message was applied twice"
    assert set(ids) == history | set(live_ids)
    last: dict[str, int] = {}
    for _, key, seq in applied:  # each key's messages applied in order, none skipped
        assert seq == last.get(key, 0) + 1, (key, seq, last.get(key))
        last[key] = seq
    assert progress
    assert progress[-1].split("/")[0] == progress[-1].split("/")[1]
    with psycopg.connect(url) as conn:
        audited = conn.execute(
            "SELECT count(DISTINCT message_id), min(reason) FROM outbox_dead_audit "
            "WHERE action = 'replay'"
        ).fetchone()
        cursor = conn.execute(
            "SELECT destination, replayed, finished_at IS NOT NULL FROM outbox_replay_cursors"
        ).fetchone()
    assert audited is not None
    assert audited[0] >= KEYS * PER_KEY
    assert audited[1] == "onboarding late"
    assert cursor is not None
    assert cursor[0] == broker.replay
    assert cursor[2]


class _Flaky(FakePublisher):
    """Confirms ``budget`` messages, then reports every further one failed."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget

        def fail(env: Envelope) -> BaseException | None:
            if self.budget <= 0:
                return RetryablePublishError("broker went away")
            self.budget -= 1
            return None

        self.fail = fail


def test_an_interrupted_replay_continues_from_its_cursor(url: str) -> None:
    _write_history(url, range(5), 20)
    _publish_history_small(url, 100)
    flaky = _Flaky(budget=37)
    with pytest.raises(ReplayError, match="run the same command again"):
        asyncio.run(replay(url, flaky, topic=TOPIC, consumer="late", batch=10))
    first = [e for _, e in flaky.log]
    assert len(first) == 37
    again = FakePublisher()
    result = asyncio.run(replay(url, again, topic=TOPIC, consumer="late", batch=10))
    assert result.resumed
    assert result.sent == 63
    assert result.replayed == 100
    second = [e for _, e in again.log]
    # nothing confirmed is sent again; together: every message once, in (key, seq) order
    assert [(e.key, e.seq) for e in first + second] == sorted(
        (f"k{k:03d}", s) for k in range(5) for s in range(1, 21)
    )
    # a second run of a finished replay sends nothing; --restart starts over
    assert asyncio.run(replay(url, FakePublisher(), topic=TOPIC, consumer="late")).sent == 0
    assert (
        asyncio.run(replay(url, FakePublisher(), topic=TOPIC, consumer="late", restart=True)).sent
        == 100
    )


def _publish_history_small(url: str, n: int) -> None:
    async def go() -> None:
        async with running(Relay(config(url), FakePublisher())):
            await _until(lambda: _published(url) == n, 60, "the history")

    asyncio.run(go())


def test_cli_replay_progress_errors_and_audit(url: str) -> None:
    _write_history(url, range(3), 4)
    _publish_history_small(url, 12)
    runner = CliRunner()
    out = runner.invoke(
        main,
        ["replay", "--topic", TOPIC, "--to", "late", "--broker", "memory:", "--url", url,
         "--rate", "100", "--reason", "new service"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "replayed 12/12 (100%)" in out.stderr
    assert "replayed 12 message(s) of orders to late at replay.late.orders; 12 in all" in (
        out.stdout
    )
    # another destination for the same consumer: refused, with what to do
    other = runner.invoke(
        main,
        ["replay", "--topic", TOPIC, "--to", "late", "--broker", "memory:", "--url", url,
         "--destination", "elsewhere"],
    )  # fmt: skip
    assert other.exit_code == 2
    assert "--restart" in other.output
    audit = runner.invoke(main, ["dead", "audit", "--url", url, "--json", "--limit", "100"])
    assert audit.exit_code == 0
    assert audit.output.count('"replay"') == 12
    nobroker = runner.invoke(
        main, ["replay", "--topic", TOPIC, "--to", "late", "--url", url], env={
            "OUTBOX_BROKER_URL": ""}
    )
    assert nobroker.exit_code == 2
    assert "no broker" in nobroker.output


@pytest.mark.parametrize(
    "template", ["{topic.x}", "{topic[0]}", "{topic!r}", "{topic:>9}", "{nope}", "{topic", "a}"]
)
def test_a_bad_destination_template_is_one_line(url: str, template: str) -> None:
    out = CliRunner().invoke(
        main,
        ["replay", "--topic", TOPIC, "--to", "late", "--broker", "memory:", "--url", url,
         "--destination", template],
    )  # fmt: skip
    assert out.exit_code == 2, out.output
    [line] = out.output.strip().splitlines()
    assert "only {topic} and {consumer} may be filled in" in line
    assert "Traceback" not in out.output


@pytest.mark.parametrize(
    "broker",
    ["nats://relay:{pw}@127.0.0.1:{port}", "kafka://relay:{pw}@127.0.0.1:{port}",
     "amqp://relay:{pw}@127.0.0.1:{port}/", "redis://:{pw}@127.0.0.1:{port}/0",
     "mqtt://relay:{pw}@127.0.0.1:{port}"],
)  # fmt: skip
def test_an_unreachable_broker_is_one_line(url: str, broker: str) -> None:
    """Not one line per reconnect attempt (nats-py's error callback), nor librdkafka's own
    lines (they go to the project's logger at DEBUG), nor aiormq's: the one error line."""
    import subprocess
    import sys

    from tests.support.server_process import free_port

    _write_history(url, range(1), 1)
    _publish_history_small(url, 1)
    password = "Sntl" + uuid.uuid4().hex[:8]
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "replay", "--topic", TOPIC, "--to", "late",
         "--broker", broker.format(pw=password, port=free_port()), "--url", url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert output.startswith("error: "), output
    assert password not in output


class _Stalling(FakePublisher):
    """Confirms ``batches`` batches, then hangs on the next one until cancelled (a Ctrl-C)."""

    def __init__(self, batches: int) -> None:
        super().__init__()
        self.batches = batches
        self.stalled = asyncio.Event()

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        if self.batches <= 0:
            self.stalled.set()
            await asyncio.Event().wait()  # until cancelled
        self.batches -= 1
        return await super().publish_batch(envelopes)


def test_a_cancelled_replay_continues_and_two_at_once_are_refused(url: str) -> None:
    _write_history(url, range(4), 10)
    _publish_history_small(url, 40)
    stalling = _Stalling(batches=3)

    async def interrupted() -> None:
        task = asyncio.create_task(replay(url, stalling, topic=TOPIC, consumer="late", batch=5))
        await asyncio.wait_for(stalling.stalled.wait(), 30)
        # meanwhile, a second replay to the same consumer is refused while the first holds it
        with pytest.raises(ConfigurationError, match="already running"):
            await replay(url, FakePublisher(), topic=TOPIC, consumer="late")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(interrupted())
    first = [e for _, e in stalling.log]
    assert len(first) == 15
    rest = FakePublisher()
    result = asyncio.run(replay(url, rest, topic=TOPIC, consumer="late", batch=5))
    assert (result.resumed, result.sent, result.replayed) == (True, 25, 40)
    assert [(e.key, e.seq) for e in first + [e for _, e in rest.log]] == sorted(
        (f"k{k:03d}", s) for k in range(4) for s in range(1, 11)
    )


def test_ctrl_c_stops_the_command_and_the_same_command_continues(url: str) -> None:
    import signal
    import subprocess
    import sys
    import time

    _write_history(url, range(2), 30)
    _publish_history_small(url, 60)
    command = [
        sys.executable, "-m", "outbox.cli", "replay", "--topic", TOPIC, "--to", "late",
        "--broker", "memory:", "--url", url, "--rate", "5", "--batch", "5",
    ]  # fmt: skip
    # At 5 a second the 60 messages take 12 s: the interrupt lands mid-replay even on a loaded
    # machine. The child gets SIGINT's default disposition: a suite started in the background
    # by a non-interactive shell inherits SIGINT ignored, and Ctrl-C would never reach it.
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while _replayed(url) < 10:  # a few batches confirmed
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the replay did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted: what the broker confirmed is kept" in err
    assert "Traceback" not in err
    kept = _replayed(url)
    assert 10 <= kept < 60
    again = subprocess.run(
        [*command[:-4], "--rate", "1000"], capture_output=True, text=True, timeout=60, check=False
    )
    assert again.returncode == 0, again.stderr
    assert f"replayed {60 - kept} message(s)" in again.stdout
    assert "(continued an earlier run); 60 in all" in again.stdout


def _replayed(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(replayed), 0) FROM outbox_replay_cursors"
        ).fetchone()
        return int(row[0]) if row else 0
