"""End to end to NATS JetStream in both capture modes, side by side in one run.

On one private PostgreSQL 15 cluster (wal_level = logical, fsync on, started on a free port;
the machine's own server is never reconfigured) and the machine's nats-server:

* ``raw``: the raw client's async publish (nats-py ``publish_async``, acks awaited per batch of
  1,000) of the same number of messages: the ceiling for any relay.
* ``adapter``: the relay's NATS adapter publishing the same number of envelopes from memory
  (no database): the ceiling for our relay in either mode, in the same run.
* ``naive``: the naive relay of bench/relay_e2e.py (SELECT unpublished, publish, UPDATE) over
  a backlog committed first.
* ``polling``: one relay process over a backlog committed first, 'polling' mode.
* ``wal``: one relay process over a backlog committed first in 'wal' mode (the messages wait
  in the slot; the relay decodes, numbers, records and publishes them).

* ``naive_db``, ``polling_db``, ``wal_db``: the same three with a publisher that acknowledges
  at once (nothing leaves the process): each one's database side alone, the floor of its
  time per message whatever the broker client costs.

Each round runs the eight; the three drains to NATS, and then their database sides, go in an
order rotated from round to round; medians are reported with the ratios the issue asks for
(wal / raw, wal / naive, polling / naive) and the floors. Then commit -> broker latency at a
steady 1,000 msg/s in both modes (one message per transaction, 4 producer threads;
relay_e2e.latency).
Run: ``python bench/capture_e2e.py [--messages N] [--rounds R] [--latency-seconds S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import relay_e2e  # noqa: E402
from bench.common import logical_cluster, write_result  # noqa: E402
from bench.relay import adapter_rate, envelopes, raw_nats  # noqa: E402

NATS = "nats://127.0.0.1:4222"


async def _raw(n: int, stream: str) -> float:
    return await raw_nats(envelopes(n, f"{stream}.raw"), stream)


async def _adapter(n: int, stream: str) -> float:
    from relay.brokers import publisher_for_url

    return await adapter_rate(publisher_for_url(NATS), envelopes(n, f"{stream}.adapter"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    args = parser.parse_args()
    with logical_cluster("outbox-bench-e2e-") as server:
        relay_e2e.ADMIN = server.admin_url
        os.environ["OUTBOX_TEST_DATABASE_URL"] = server.admin_url
        result = asyncio.run(_measure(args.messages, args.rounds, args.latency_seconds))
    print(write_result("capture_e2e", result))


async def _measure(n: int, rounds: int, latency_seconds: float) -> dict[str, Any]:
    import nats

    nc = await nats.connect(NATS)
    js = nc.jetstream()
    stream = f"bench{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    drains = ("naive", "polling", "wal", "naive_db", "polling_db", "wal_db")
    runs: dict[str, list[float]] = {"raw": [], "adapter": [], **{d: [] for d in drains}}
    details: dict[str, list[dict[str, Any]]] = {d: [] for d in drains}
    try:
        for r in range(rounds):
            runs["raw"].append(round(await _raw(n, stream)))
            runs["adapter"].append(round(await _adapter(n, stream)))
            # the three drains to NATS, then their database sides alone, each group's order
            # rotated from round to round
            for group in (drains[:3], drains[3:]):
                for name in group[r % 3 :] + group[: r % 3]:
                    broker = relay_e2e.NOOP if name.endswith("_db") else NATS
                    subject = f"{stream}.{name.replace('_', '')}{r}"
                    if name.startswith("naive"):
                        row = await asyncio.to_thread(
                            relay_e2e.naive_drain, broker, subject, n, keys=1000
                        )
                    else:
                        row = await asyncio.to_thread(
                            relay_e2e.drain, broker, subject, n, keys=1000,
                            capture=name.startswith("wal"),
                        )  # fmt: skip
                    runs[name].append(row["msg_per_s"])
                    details[name].append(row)
            print({"round": r, **{k: v[-1] for k, v in runs.items()}}, flush=True)
        latency = {}
        for mode, capture in (("polling", False), ("wal", True)):
            latency[mode] = await relay_e2e.latency(
                NATS, f"{stream}.lat{mode}", seconds=latency_seconds, capture=capture
            )
            print({"latency": mode, **latency[mode]}, flush=True)
    finally:
        await js.delete_stream(stream)
        await nc.close()
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "what": "backlog of N committed messages drained to NATS JetStream by one relay process",
        "server": "private PostgreSQL 15 cluster, wal_level = logical, fsync on",
        "messages": n,
        "keys": 1000,
        "rounds": rounds,
        "order": "raw, adapter, then naive/polling/wal rotated by one each round, then "
        "naive_db/polling_db/wal_db rotated alike",
        "msg_per_s": runs,
        "medians_msg_per_s": med,
        "ratio_wal_over_raw": round(med["wal"] / med["raw"], 3),
        "ratio_adapter_over_raw": round(med["adapter"] / med["raw"], 3),
        "ratio_wal_over_adapter": round(med["wal"] / med["adapter"], 3),
        "ratio_wal_over_naive": round(med["wal"] / med["naive"], 3),
        "ratio_polling_over_raw": round(med["polling"] / med["raw"], 3),
        "ratio_polling_over_naive": round(med["polling"] / med["naive"], 3),
        "floor": "each mode's database side alone (a publisher that acknowledges at once), "
        "over the naive relay end to end: the most the relay could reach with a free broker "
        "client",
        "ratio_wal_db_over_naive": round(med["wal_db"] / med["naive"], 3),
        "ratio_polling_db_over_naive": round(med["polling_db"] / med["naive"], 3),
        "ratio_naive_db_over_naive": round(med["naive_db"] / med["naive"], 3),
        "every_message_acked_once": all(
            row.get("acked_by_broker") == n for rows in details.values() for row in rows
        ),
        "details": details,
        "latency_at_1000_msg_per_s": latency,
    }


if __name__ == "__main__":
    main()
