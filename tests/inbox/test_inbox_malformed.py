"""A consumer fed malformed broker messages never crashes or loops: each is recorded dead for
the consumer with its reason (when its id can be read) and settled at the broker. When its seq
can be read the key moves on (on_dead="skip"); when not, nobody can tell which message of the
key it was, so the key waits and `blocked_keys` shows it. Live NATS JetStream."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Outcome
from inbox.admin import blocked_keys
from inbox.testing import ResultLog, wait_until_processed
from outbox.envelope import HEADER_CREATED_AT, HEADER_SEQ
from tests.inbox.inbox_helpers import effects, inbox_rows, make_envelope
from tests.inbox.test_inbox_brokers import _broker

BAD_HEADERS = [  # (headers, the reason recorded, whether the seq can be read)
    ({HEADER_SEQ: "two"}, "not a positive integer", False),
    ({HEADER_SEQ: "0"}, "seq must be a positive int", False),
    ({HEADER_CREATED_AT: "yesterday"}, "not an ISO 8601 time", True),
]


@pytest.mark.parametrize(("bad", "reason", "seq_known"), BAD_HEADERS)
def test_malformed_message_is_dead_with_its_reason_and_never_stops_the_consumer(
    effects_url: str, bad: dict[str, str], reason: str, seq_known: bool
) -> None:
    async def main() -> ResultLog:
        broker = _broker("nats")
        log = ResultLog()
        first, broken, third = (make_envelope(key="K", seq=s) for s in (1, 2, 3))
        await broker.setup()
        try:
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as pool:

                async def handler(conn: Any, msg: Any) -> None:
                    await conn.execute(
                        "INSERT INTO effects (consumer, message_id, key, seq) "
                        "VALUES ('svc', %s, %s, %s)",
                        (msg.id, msg.key, msg.seq),
                    )

                runner = AsyncHandlerRunner(pool, handler, consumer="svc", ordered=True)
                consumer = broker.consumer(runner, log, 0)
                task = asyncio.create_task(consumer.run())
                async with asyncio.timeout(20):
                    await consumer.ready.wait()
                js: Any = broker.js  # type: ignore[attr-defined]
                subject: str = broker.subject  # type: ignore[attr-defined]
                await broker.publish([first])
                headers = {**broken.to_headers(), **bad, "Nats-Msg-Id": str(broken.id)}
                await js.publish(subject, b'{"n": 2}', headers=headers)
                await js.publish(subject, b"not even headers")  # no id: settled, not recorded
                await broker.publish([third])
                wanted = [first.id, broken.id, third.id] if seq_known else [first.id, broken.id]
                await asyncio.to_thread(
                    wait_until_processed, effects_url, consumer="svc", ids=wanted, timeout=30
                )
                if not seq_known:  # the key waits for a seq 2 that nobody can identify
                    await log.wait_for(lambda lg: third.id in lg.outcomes(Outcome.OUT_OF_ORDER))
                assert not task.done(), "the consumer stopped on a bad message"
                consumer.stop()
                await task
        finally:
            await broker.teardown()
        rows = inbox_rows(effects_url, "svc")
        status, _, last_error, seq = rows[broken.id]
        assert (status, seq) == ("dead", 2 if seq_known else None)
        assert reason in last_error
        return log

    log = asyncio.run(main())
    applied = [row[3] for row in effects(effects_url, "svc")]
    blocked = blocked_keys(effects_url, min_age=dt.timedelta(0))
    if seq_known:  # moved on past it
        assert (applied, blocked) == ([1, 3], [])
    else:
        assert applied == [1]
        assert [(b.key, b.last_seq, b.waiting_seq) for b in blocked] == [("K", 1, 3)]
    assert not log.outcomes(Outcome.FAILED)


def test_invalid_ref_makes_any_text_storable() -> None:
    from inbox._receive import invalid_ref

    ref = invalid_ref("svc", uuid.uuid4(), "to\x00pic", "\ud800" + "k" * 2000, 2**64)
    assert ref is not None
    assert "\x00" not in ref.topic
    assert len(ref.key.encode()) <= 1024
    assert ref.seq is None
    assert invalid_ref("svc", "not-a-uuid", "t", "k", 1) is None
    assert invalid_ref("svc", None, "t", "k", 1) is None


def test_a_malformed_message_fetched_with_its_predecessor_still_moves_the_key_on(
    effects_url: str,
) -> None:
    """Published before the consumer starts, the three messages of a key arrive in one fetch:
    the malformed second one is recorded dead after the first is applied (in its key's turn),
    so it moves the key on and the third is applied."""

    async def main() -> None:
        broker = _broker("nats")
        first, broken, third = (make_envelope(key="K", seq=s) for s in (1, 2, 3))
        await broker.setup()
        try:
            js: Any = broker.js  # type: ignore[attr-defined]
            subject: str = broker.subject  # type: ignore[attr-defined]
            await broker.publish([first])
            bad = {**broken.to_headers(), HEADER_CREATED_AT: "yesterday",
                   "Nats-Msg-Id": str(broken.id)}  # fmt: skip
            await js.publish(subject, b'{"n": 2}', headers=bad)
            await broker.publish([third])
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as pool:

                async def handler(conn: Any, msg: Any) -> None:
                    await conn.execute(
                        "INSERT INTO effects (consumer, message_id, key, seq) "
                        "VALUES ('svc', %s, %s, %s)",
                        (msg.id, msg.key, msg.seq),
                    )

                runner = AsyncHandlerRunner(pool, handler, consumer="svc", ordered=True)
                consumer = broker.consumer(runner, ResultLog(), 0)
                task = asyncio.create_task(consumer.run())
                await asyncio.to_thread(
                    wait_until_processed, effects_url, consumer="svc",
                    ids=[first.id, broken.id, third.id], timeout=30,
                )  # fmt: skip
                consumer.stop()
                await task
        finally:
            await broker.teardown()

    asyncio.run(main())
    assert [row[3] for row in effects(effects_url, "svc")] == [1, 3]
    assert blocked_keys(effects_url, min_age=dt.timedelta(0)) == []
