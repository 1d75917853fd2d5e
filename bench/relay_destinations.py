"""One misrouted topic beside a good one: does the good topic still drain at full speed?

    python bench/relay_destinations.py

Same run, NATS JetStream on 127.0.0.1:4222, one in-process relay with default settings:
(a) 20,000 messages of a topic whose subject a stream covers, alone; (b) the same 20,000 with
2,000 messages of a second topic pending first, whose subject no stream covers (a configuration
mistake). Rate = good messages / (last good published_at - start). Writes
bench/results/relay_destinations.json with the ratio (b)/(a) and the misrouted rows' state
(they must stay pending with no attempt charged).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from bench.common import write_result
from bench.relay_e2e import create_db, drop_db, fill
from relay import Relay, RelayConfig
from relay.brokers import publisher_for_url

GOOD, BAD, KEYS = 20_000, 2_000, 200


async def _drain(with_bad: bool) -> dict[str, Any]:
    import nats

    name, url = create_db()
    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    stream = f"BD_{uuid.uuid4().hex[:8]}"
    prefix = stream.lower()
    await js.add_stream(name=stream, subjects=[f"{prefix}.good"])
    try:
        if with_bad:  # the misrouted backlog first: the keys walk meets it before the good one
            await asyncio.to_thread(fill, url, "a-misrouted", BAD, 50)
        await asyncio.to_thread(fill, url, "good", GOOD, KEYS)
        pub = publisher_for_url(
            "nats://127.0.0.1:4222", destinations={"*": prefix + ".{topic}"}, stream=stream,
            ack_timeout=8.0,
        )  # fmt: skip
        relay = Relay(RelayConfig(database_url=url), pub)
        started = time.time()
        task = asyncio.create_task(relay.run())
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 600
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status <> 'published'), "
                    "extract(epoch FROM max(published_at)) FROM outbox_messages "
                    "WHERE topic = 'good'"
                ).fetchone()
                assert row is not None
                if row[0] == 0:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{row[0]} good messages still pending after 600 s")
                await asyncio.sleep(0.1)
            took = float(row[1]) - started
            bad = conn.execute(
                "SELECT status, count(*), max(attempts) FROM outbox_messages "
                "WHERE topic = 'a-misrouted' GROUP BY status"
            ).fetchall()
        relay.stop()
        await task
        stored = int((await js.stream_info(stream)).state.messages)
        return {
            "good_messages": GOOD,
            "misrouted_pending": BAD if with_bad else 0,
            "seconds": round(took, 3),
            "good_msg_per_s": round(GOOD / took),
            "stream_messages": stored,
            "misrouted_rows": [list(r) for r in bad],
        }
    finally:
        await js.delete_stream(stream)
        await nc.close()
        drop_db(name)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help only
    alone = asyncio.run(_drain(with_bad=False))
    print(alone, flush=True)
    beside = asyncio.run(_drain(with_bad=True))
    print(beside, flush=True)
    path = write_result(
        "relay_destinations",
        {
            "description": __doc__.strip().splitlines()[2:],
            "a_good_topic_alone": alone,
            "b_good_topic_beside_a_misrouted_one": beside,
            "ratio_b_to_a": round(beside["good_msg_per_s"] / alone["good_msg_per_s"], 3),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
