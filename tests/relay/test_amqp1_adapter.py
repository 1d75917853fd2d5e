"""The AMQP 1.0 adapter's connection options, live on the private node
(tests/support/amqp1_broker.py): SASL PLAIN and ANONYMOUS, a wrong password (refused, and not
in the error), TLS with the server's certificate checked against a CA (and refused without it);
and how each disposition and link error is classified (pure logic)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from outbox.envelope import Envelope
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationUnavailableError,
    NotSentError,
    PermanentPublishError,
    RetryablePublishError,
)
from tests.support.amqp1_broker import node
from tests.support.services import import_or_missing


def _env() -> Envelope:
    return Envelope(id=uuid.uuid4(), topic="t", key="k", seq=1, payload=b"{}")


def _publish(url: str, **options: Any) -> list[BaseException | None]:
    from relay.brokers import publisher_for_url

    pub = publisher_for_url(url, destinations={"t": f"/queue/a{uuid.uuid4().hex[:8]}"},
                            connect_timeout=5, **options)  # fmt: skip

    async def body() -> list[BaseException | None]:
        try:
            return await pub.publish_batch([_env()])
        finally:
            await pub.close()

    return asyncio.run(body())


@pytest.fixture
def amqp1() -> Any:
    import_or_missing("proton", "amqp1")
    return node()


def test_sasl_plain_and_anonymous(amqp1: Any) -> None:
    assert _publish(amqp1.url) == [None]
    assert _publish(f"amqp1://127.0.0.1:{amqp1.port}") == [None]  # the plugin's default user


def test_wrong_password_is_refused_without_showing_it(amqp1: Any) -> None:
    with pytest.raises(BrokerUnreachableError) as caught:
        _publish(f"amqp1://guest:n0t-the-Pw@127.0.0.1:{amqp1.port}")
    assert "n0t-the-Pw" not in str(caught.value)
    assert "guest@127.0.0.1" in str(caught.value)


def test_tls_checks_the_server_certificate(amqp1: Any) -> None:
    assert _publish(amqp1.tls_url, tls_ca=str(amqp1.ca)) == [None]
    with pytest.raises(BrokerUnreachableError):  # a certificate no trusted CA signed
        _publish(amqp1.tls_url)
    assert _publish(amqp1.tls_url, tls_verify=False) == [None]


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        (("accepted",), type(None)),
        (("released",), RetryablePublishError),
        (("modified",), RetryablePublishError),
        (("lost", "reset"), BrokerUnreachableError),
        (("not_sent",), NotSentError),
        (("too_large", 1000), PermanentPublishError),
        (("rejected", "amqp:decode-error", "bad"), PermanentPublishError),
        (("rejected", "com.microsoft:server-busy", "busy"), RetryablePublishError),
        (("rejected", "amqp:resource-limit-exceeded", "quota"), RetryablePublishError),
        (("rejected", "amqp:not-found", "gone"), DestinationUnavailableError),
        (("link", "amqp:not-found", "no exchange"), DestinationUnavailableError),
        (("link", "amqp:unauthorized-access", "denied"), DestinationUnavailableError),
        (("link", "amqp:link:detach-forced", "bye"), RetryablePublishError),
        (None, RetryablePublishError),  # no disposition before the deadline
    ],
)
def test_outcomes_are_classified(outcome: Any, kind: type) -> None:
    import_or_missing("proton", "amqp1")
    from relay.brokers.amqp1 import Amqp1Publisher

    result = Amqp1Publisher("amqp1://127.0.0.1:1")._result(_env(), "q", outcome)
    assert isinstance(result, kind)
    if kind is RetryablePublishError:  # not one of its narrower kinds
        assert not isinstance(result, BrokerUnreachableError | DestinationUnavailableError)
    if outcome is not None and outcome[0] == "rejected" and kind is PermanentPublishError:
        assert "bad" in str(result)  # the broker's own error is kept


def test_a_broker_that_stops_answering_fails_the_batch_within_the_timeout() -> None:
    """The node's VM is frozen (SIGSTOP): no disposition comes; the batch comes back retryable
    within the adapter's timeout, and once the node runs again the next batch goes through."""
    import_or_missing("proton", "amqp1")
    import os
    import signal
    import time

    from relay.brokers.amqp1 import Amqp1Publisher
    from tests.support.amqp1_broker import Node

    broker = Node()
    try:
        pub = Amqp1Publisher(broker.url, destinations={"t": "/queue/frozen"}, timeout=1.5)
        pid = broker.vm_pid()
        assert pid is not None

        async def body() -> None:
            assert await pub.publish_batch([_env()]) == [None]
            os.kill(pid, signal.SIGSTOP)
            try:
                began = time.monotonic()
                results = await pub.publish_batch([_env() for _ in range(50)])
                assert time.monotonic() - began < 4.0
                assert all(isinstance(r, RetryablePublishError) for r in results), results[:2]
                assert "no disposition" in str(results[0])
            finally:
                os.kill(pid, signal.SIGCONT)
            assert await pub.publish_batch([_env()]) == [None]
            await pub.close()

        asyncio.run(body())
    finally:
        broker.stop()
