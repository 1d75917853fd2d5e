"""One misrouted topic must not stall the others (live NATS JetStream, real PostgreSQL).

A topic whose subject no stream covers is a configuration mistake, not a broker outage: its
messages wait, untried and uncharged, while every other topic drains at full speed; `outbox
status` and the metrics name the paused topic and why; once a stream covers it, its messages
go out in per-key order."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
from click.testing import CliRunner

from relay import Relay
from relay._metrics import RelayMetrics
from relay.brokers import publisher_for_url
from relay.cli import status_cmd
from tests.relay.broker_helpers import need
from tests.relay.relay_helpers import await_for, config, running, write


def _pending_bad(url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT status, count(*), max(attempts - (lease_token IS NOT NULL)::int) "
            "FROM outbox_messages WHERE topic = 'bad' GROUP BY status"
        ).fetchall()


def test_a_topic_without_a_stream_waits_while_the_others_flow(url: str) -> None:
    need(4222, "NATS")
    import nats

    async def go() -> tuple[list[int], dict[str, Any], float, float]:
        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        name = f"RD_{__import__('uuid').uuid4().hex[:10]}"
        prefix = name.lower()
        await js.add_stream(name=name, subjects=[f"{prefix}.good"])  # nothing covers .bad
        try:
            # the misrouted topic's backlog first, so every claim meets it before the good one
            await asyncio.to_thread(write, url, [("bad", f"b{i % 20}") for i in range(200)])
            await asyncio.to_thread(write, url, [("good", f"g{i % 50}") for i in range(1000)])
            pub = publisher_for_url(
                "nats://127.0.0.1:4222",
                destinations={"*": prefix + ".{topic}"},
                stream=name,
                timeout=1.5,
            )
            metrics = RelayMetrics.prometheus()
            relay = Relay(config(url, heartbeat_interval=0.2), pub, metrics=metrics)
            async with running(relay):

                async def stored() -> int:
                    return int((await js.stream_info(name)).state.messages)

                paused = relay.dispatcher.destinations.paused
                await await_for(lambda: "bad" in paused(), what="pause")
                deadline = asyncio.get_running_loop().time() + 30
                while await stored() < 1000:  # every good message, while bad ones wait
                    assert asyncio.get_running_loop().time() < deadline, "good topic stalled"
                    await asyncio.sleep(0.02)
                assert _pending_bad(url) == [("pending", 200, 0)]  # untried, uncharged
                await await_for(
                    lambda: _status(url)["paused_destinations"] != [], what="status shows it"
                )
                status = _status(url)
                paused_gauge = metrics.registry.get_sample_value(
                    "outbox_relay_destination_paused", {"topic": "bad"}
                )
                # the operator fixes the configuration: a stream now covers the bad subject
                await js.update_stream(name=name, subjects=[f"{prefix}.good", f"{prefix}.bad"])
                while await stored() < 1200:
                    assert asyncio.get_running_loop().time() < deadline + 30, "bad never resumed"
                    await asyncio.sleep(0.05)
                resumed_gauge = metrics.registry.get_sample_value(
                    "outbox_relay_destination_paused", {"topic": "bad"}
                )
            seqs = await _seqs_by_key(js, name)
            return seqs, status, paused_gauge, resumed_gauge
        finally:
            await js.delete_stream(name)
            await nc.close()

    seqs, status, paused_gauge, resumed_gauge = asyncio.run(go())
    assert seqs == [list(range(1, 11))] * 20 + [list(range(1, 21))] * 50  # per-key order
    [paused] = status["paused_destinations"]
    assert paused["topic"] == "bad"
    assert "no JetStream stream answered" in paused["reason"]
    assert "create a stream" in paused["reason"]
    assert (paused_gauge, resumed_gauge) == (1.0, 0.0)
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT status, count(*), max(attempts) FROM outbox_messages GROUP BY status"
        ).fetchall() == [("published", 1200, 1)]


def _status(url: str) -> dict[str, Any]:
    out = CliRunner().invoke(status_cmd, ["--url", url, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)  # type: ignore[no-any-return]


async def _seqs_by_key(js: Any, stream: str) -> list[list[int]]:
    info = await js.stream_info(stream)
    by_key: dict[str, list[int]] = {}
    for n in range(1, info.state.messages + 1):
        msg = await js.get_msg(stream, n)
        key = f"{msg.headers['outbox-topic']}/{msg.headers['outbox-key']}"
        by_key.setdefault(key, []).append(int(msg.headers["outbox-seq"]))
    return [by_key[k] for k in sorted(by_key)]
