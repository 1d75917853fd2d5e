"""`outbox status` with the cloud's brokers (moto's SQS and SNS, the private AMQP 1.0 node): each
relay's broker family and URL (no password), a topic whose destination is missing shown paused
with that destination, and flowing again (gone from the view) once it exists."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from outbox._redact import redact
from relay import Relay
from relay.brokers import publisher_for_url
from relay.cli import status_cmd
from tests.relay.relay_helpers import await_for, config, running, statuses, write
from tests.support.services import import_or_missing


def _status(url: str, *args: str) -> Any:
    out = CliRunner().invoke(status_cmd, ["--url", url, *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout) if "--json" in args else out.stdout


def _paused_then_resumed(
    url: str, broker_url: str, destination: str, create: Callable[[], None]
) -> tuple[dict[str, Any], str]:
    """Relay one topic to a missing ``destination``; the status while it is paused (JSON and
    text); then ``create`` it and wait until every message is published."""

    async def go() -> tuple[dict[str, Any], str]:
        await asyncio.to_thread(write, url, [("orders", f"k{i}") for i in range(3)])
        pub = publisher_for_url(broker_url, destinations={"orders": destination}, ack_timeout=4)
        relay = Relay(config(url, broker_url=broker_url, publish_timeout=5, lease_seconds=8), pub)
        async with running(relay):
            await await_for(
                lambda: _status(url, "--json")["paused_destinations"] != [],
                within=30,
                what="the paused destination in the status",
            )
            shown = _status(url, "--json"), _status(url)
            await asyncio.to_thread(create)
            await await_for(lambda: statuses(url) == {"published": 3}, within=60, what="resume")
            await await_for(
                lambda: _status(url, "--json")["paused_destinations"] == [],
                within=30,
                what="the pause gone from the status",
            )
        return shown

    return asyncio.run(go())


def _check(doc: dict[str, Any], text: str, kind: str, broker: str, destination: str) -> None:
    [relay] = doc["relays"]
    assert relay["broker_kind"] == kind
    assert relay["broker"] == broker
    [paused] = doc["paused_destinations"]
    assert paused["topic"] == "orders"
    assert paused["destination"] == destination
    assert paused["broker_kind"] == kind
    assert f"broker: {kind}, {broker}" in text
    assert f"orders -> {destination} on {kind} since" in text


@pytest.mark.parametrize("service", ["sqs", "sns"])
def test_status_shows_an_aws_destination_paused_and_the_broker(url: str, service: str) -> None:
    import_or_missing("boto3", "aws")
    import tests.support.aws_server as aws_server

    endpoint = aws_server.endpoint()
    tag = uuid.uuid4().hex[:10]
    sqs = aws_server.client("sqs")
    sns = aws_server.client("sns")
    made: list[str] = []
    if service == "sqs":
        destination = f"status-{tag}.fifo"

        def create() -> None:
            attributes = {"FifoQueue": "true"}
            made.append(sqs.create_queue(QueueName=destination, Attributes=attributes)["QueueUrl"])

    else:
        destination = f"arn:aws:sns:{aws_server.REGION}:123456789012:status-{tag}"

        def create() -> None:
            made.append(sns.create_topic(Name=f"status-{tag}")["TopicArn"])

    broker = f"{service}://{aws_server.REGION}?endpoint={endpoint}"
    try:
        doc, text = _paused_then_resumed(url, broker, destination, create)
    finally:
        for made_url in made:
            if service == "sqs":
                sqs.delete_queue(QueueUrl=made_url)
            else:
                sns.delete_topic(TopicArn=made_url)
    kind = {"sqs": "Amazon SQS", "sns": "Amazon SNS"}[service]
    _check(doc, text, kind, broker, destination)
    assert "does not exist" in doc["paused_destinations"][0]["reason"].lower() or (
        "create the" in doc["paused_destinations"][0]["reason"]
    )


def test_status_shows_an_amqp1_destination_paused_without_the_password(url: str) -> None:
    import_or_missing("proton", "amqp1")
    import aio_pika

    from tests.support.amqp1_broker import node

    broker_node = node()
    exchange = f"status-{uuid.uuid4().hex[:10]}"
    destination = f"/exchange/{exchange}/orders"

    def create() -> None:
        async def declare() -> None:
            conn = await aio_pika.connect(broker_node.url.replace("amqp1://", "amqp://"))
            async with conn:
                channel = await conn.channel()
                await channel.declare_exchange(exchange, "direct", durable=False, auto_delete=True)

        asyncio.run(declare())

    doc, text = _paused_then_resumed(url, broker_node.url, destination, create)
    shown = redact(broker_node.url)  # the user too: it is also the password ("guest")
    assert shown.startswith("amqp1://")
    assert "***@127.0.0.1" in shown
    _check(doc, text, "AMQP 1.0", shown, destination)
    for output in (json.dumps(doc), text):
        assert "guest:guest" not in output
