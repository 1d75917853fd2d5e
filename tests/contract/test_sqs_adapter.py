"""What is particular to the SQS and SNS adapters: the URL, the features a destination map
implies, how the services' refusals are classified, and the call size limits (live on moto
where a service is involved)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from relay.brokers import publisher_for_url
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationUnavailableError,
    PermanentPublishError,
    RetryablePublishError,
)
from tests.support.services import import_or_missing


@pytest.fixture(autouse=True)
def _boto3() -> None:
    import_or_missing("boto3", "aws")


def _env(**fields: Any) -> Envelope:
    base: dict[str, Any] = {"id": uuid.uuid4(), "topic": "t", "key": "k", "seq": 1,
                            "payload": b"{}"}  # fmt: skip
    return Envelope(**{**base, **fields})


def test_sqs_url_names_region_and_endpoint() -> None:
    from relay.brokers.sqs import SnsPublisher, SqsPublisher

    pub: Any = publisher_for_url("sqs://eu-west-1?endpoint=http://127.0.0.1:4566",
                                 destinations={"*": "{topic}.fifo"})  # fmt: skip
    assert isinstance(pub, SqsPublisher)
    assert (pub._region, pub._endpoint_url) == ("eu-west-1", "http://127.0.0.1:4566")
    assert pub.features.keeps_key_order
    assert pub.features.dedup_window_seconds == 300
    sns: Any = publisher_for_url("sns://", destinations={"orders": "orders"}, ack_timeout=3)
    assert isinstance(sns, SnsPublisher)
    assert sns._region is None  # AWS's default (AWS_DEFAULT_REGION, the profile)
    assert not sns.features.keeps_key_order  # a standard topic neither orders nor dedups
    assert sns.features.ack_timeout_seconds == 3


def test_sqs_url_refuses_credentials_without_echoing_them() -> None:
    with pytest.raises(ConfigurationError, match="default chain") as info:
        publisher_for_url("sqs://AKIAEXAMPLE:s3cr3t@us-east-1")
    assert "s3cr3t" not in str(info.value)
    with pytest.raises(ConfigurationError, match="not known"):
        publisher_for_url("sqs://us-east-1?secret=x")


@pytest.mark.parametrize(
    ("code", "sender_fault", "kind"),
    [
        ("AWS.SimpleQueueService.NonExistentQueue", True, DestinationUnavailableError),
        ("AccessDenied", True, DestinationUnavailableError),
        ("KmsAccessDenied", True, DestinationUnavailableError),
        ("AuthorizationError", True, DestinationUnavailableError),
        ("InvalidClientTokenId", True, BrokerUnreachableError),
        ("ExpiredToken", True, BrokerUnreachableError),
        ("ThrottlingException", True, RetryablePublishError),
        ("RequestThrottled", True, RetryablePublishError),
        ("KMS.ThrottlingException", True, RetryablePublishError),
        ("InternalError", False, RetryablePublishError),
        ("SomethingNew", False, RetryablePublishError),
        ("InvalidMessageContents", True, PermanentPublishError),
        ("InvalidParameterValue", True, PermanentPublishError),
    ],
)
def test_sqs_refusals_are_classified(code: str, sender_fault: bool, kind: type) -> None:
    from relay.brokers.sqs import SqsPublisher

    pub = SqsPublisher("us-east-1")
    err = pub._classify_code(_env(), "q", code, "it says why", sender_fault=sender_fault)
    assert type(err) is kind
    assert code in str(err)


def test_sqs_a_call_holds_at_most_ten_messages_and_the_queues_size() -> None:
    """A batch larger than ten, and one whose messages together exceed the queue's limit, go
    in several calls (SQS refuses the whole call otherwise), and every message is confirmed."""
    from relay.brokers.sqs import SqsPublisher
    from tests.support import aws_server

    sqs = aws_server.client("sqs")
    name = f"size{uuid.uuid4().hex[:8]}.fifo"
    url = sqs.create_queue(QueueName=name, Attributes={
        "FifoQueue": "true", "MaximumMessageSize": "4096"})["QueueUrl"]  # fmt: skip
    calls: list[int] = []

    class Counting(SqsPublisher):
        def _send(self, address: str, entries: list[dict[str, Any]]) -> Any:
            calls.append(sum(len(e["MessageBody"]) for e in entries))
            assert len(entries) <= 10
            return super()._send(address, entries)

    envelopes = [_env(key="one", seq=i + 1, payload=b"x" * 1500) for i in range(12)]

    async def main() -> list[BaseException | None]:
        pub = Counting(endpoint_url=aws_server.endpoint(), destinations={"t": name}, timeout=10)
        await pub.start()
        try:
            return await pub.publish_batch(envelopes)
        finally:
            await pub.close()

    try:
        assert asyncio.run(main()) == [None] * 12
        assert max(calls) <= 4096
        assert len(calls) >= 6  # two 1.5 kB messages (with attributes) per 4 kB call
    finally:
        sqs.delete_queue(QueueUrl=url)


def test_sqs_url_destination_template_for_the_command_line() -> None:
    """``outbox relay`` has no destinations flag: the URL's ``destination`` maps the topics."""
    pub: Any = publisher_for_url("sqs://?destination={topic}-events.fifo",
                                 destinations={"audit": "audit-log"})  # fmt: skip
    assert pub._destination("orders") == "orders-events.fifo"
    assert pub._destination("audit") == "audit-log"  # an exact entry wins
    assert not pub.features.keeps_key_order  # audit-log is a standard queue


def test_sqs_unreachable_error_shows_no_secret_of_the_endpoint() -> None:
    from relay.brokers.sqs import SqsPublisher

    pub = SqsPublisher(endpoint_url="http://user:s3cr3t@127.0.0.1:1/?token=t0ken",
                       connect_timeout=1)  # fmt: skip

    async def main() -> None:
        with pytest.raises(BrokerUnreachableError, match=r"127\.0\.0\.1:1") as info:
            await pub.start()
        assert "s3cr3t" not in str(info.value)
        assert "t0ken" not in str(info.value)

    asyncio.run(main())


def test_sqs_an_endpoint_that_does_not_answer_in_time_is_unreachable_not_a_crash() -> None:
    """A listener that accepts and never answers: the start-up probe's read times out (a
    botocore HTTP error, whose ``response`` is None) and the error says the endpoint cannot be
    reached, naming the timeout (it once said ``AttributeError``)."""
    import socket

    import tests.support.aws_server as aws_server
    from relay.brokers.sqs import SqsPublisher

    aws_server.aws_env()  # dummy credentials: the probe goes out
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        pub = SqsPublisher("us-east-1", endpoint_url=f"http://127.0.0.1:{port}", timeout=2)

        async def main() -> None:
            with pytest.raises(BrokerUnreachableError, match="cannot reach") as info:
                await pub.start()
            assert "AttributeError" not in str(info.value)
            assert "timeout" in str(info.value).lower()

        asyncio.run(main())
