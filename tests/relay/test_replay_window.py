"""``outbox replay`` into the live subject's own stream, inside JetStream's duplicate window,
stores every message: a replay's ``Nats-Msg-Id`` is the message id plus the replay's token, so
JetStream does not take it for a duplicate of the original, while the envelope keeps the
original id (what the inbox dedups on). A replay started over (``--restart``) is stored again;
the inbox still applies each message once."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import psycopg

from outbox.wire import nats as wire
from relay import Relay, replay
from relay.brokers import publisher_for_url
from tests.relay.relay_helpers import await_for, config, running, statuses, write
from tests.support.nats_server import PrivateNats
from tests.support.services import import_or_missing


async def _stream_messages(js: Any, stream: str) -> list[Any]:
    info = await js.stream_info(stream)
    return [await js.get_msg(stream, seq)
            for seq in range(info.state.first_seq, info.state.last_seq + 1)]  # fmt: skip


def _advisory_locks(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_replay_into_the_live_stream_within_the_window_is_stored_whole(
    url: str, tmp_path: Path
) -> None:
    import_or_missing("nats", "nats")
    import nats

    topic = f"orders-{uuid.uuid4().hex[:6]}"
    ids = write(url, [(topic, f"k{i % 5}") for i in range(20)])

    async def go(server: str) -> None:
        nc = await nats.connect(server)
        js = nc.jetstream()
        # one stream for the live subject and the replay's (the onboarding page allows it),
        # with JetStream's default duplicate window of two minutes
        await js.add_stream(name="SHOP", subjects=["live.>", "replay.>"])
        pub = publisher_for_url(server, destinations={topic: f"live.{topic}"}, ack_timeout=1.5)
        relay = Relay(config(url), pub)
        async with running(relay):
            await await_for(lambda: statuses(url).get("published") == 20, 30, "published")
        first = await replay(url, server, topic=topic, consumer="late")
        assert first.sent == 20
        stored = await _stream_messages(js, "SHOP")
        assert len(stored) == 40, "JetStream dropped replayed messages as duplicates"
        replayed = [m for m in stored if m.subject.startswith("replay.")]
        assert len(replayed) == 20
        # the envelope is the original's: same id (the inbox dedups on it), no extra header
        decoded = [wire.decode(m.headers, m.data) for m in replayed]
        assert sorted(e.id for e in decoded) == sorted(ids)
        assert all(e.headers == {} for e in decoded)
        msg_ids = {m.headers["Nats-Msg-Id"] for m in stored}
        assert len(msg_ids) == 40
        # started over within the window: stored again, not dropped as the first run's copies
        # (once the first run's session, gone, has released its advisory lock: the server
        # ends a closed connection's backend a moment after the client)
        await await_for(lambda: _advisory_locks(url) == 0, 10, "the first run's lock released")
        again = await replay(url, server, topic=topic, consumer="late", restart=True)
        assert again.sent == 20
        assert len(await _stream_messages(js, "SHOP")) == 60
        await nc.close()

    with PrivateNats(tmp_path / "js") as server:
        asyncio.run(go(server.url))
