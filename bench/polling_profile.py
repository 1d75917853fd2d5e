"""Where the 'polling' relay's database time goes: its claim and mark, alone, on the backlog
shape of bench/capture_e2e.py (20,000 messages over 1,000 keys, default settings).

On a fresh database of the server at ``--admin`` (the machine's PostgreSQL by default; a
database of its own, dropped at the end):

* ``explain``: ``EXPLAIN (ANALYZE, BUFFERS)`` of the first claim and of its mark (every row
  published), the plans kept whole in the results;
* ``loop``: one connection claims and marks (every row published) until the backlog is
  drained, one statement after the other with nothing published: the client's time per
  statement per message, the claims' sizes and the rate. (The relay overlaps several batches;
  this is each statement's cost alone.)

Run: ``python bench/polling_profile.py [--admin URL] [--messages N] [--keys K] [--rounds R]``;
results in ``bench/results/<--name>.json`` (``polling_profile``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench import relay_e2e  # noqa: E402
from bench.common import write_result  # noqa: E402
from relay._claim import Outcome, claim_batch, mark_batch, relay_session, resume_point  # noqa: E402
from relay._config import RelayConfig  # noqa: E402
from relay._statements import relay_statements  # noqa: E402

S = relay_statements(None)
CONFIG = RelayConfig(database_url="unused")


def _claim_params(token: uuid.UUID) -> dict[str, Any]:
    return {"after_topic": "", "after_key": "", "limit": CONFIG.batch_size,
            "per_key": CONFIG.per_key_batch, "owner": "profile", "token": token,
            "lease_seconds": 30, "paused": [], **CONFIG.dead_policy_params()}  # fmt: skip


def explain(url: str) -> dict[str, Any]:
    """The plans (with timings) of the first claim and of its mark."""
    with psycopg.connect(url, autocommit=True) as conn:
        token = uuid.uuid4()
        with conn.transaction(force_rollback=True):  # the plan of the claim, then undone
            plan = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS) " + S.claim, _claim_params(token))
            claim_plan = [r[0] for r in plan.fetchall()]
        ids = [r[0] for r in conn.execute(S.claim, _claim_params(token)).fetchall()]
        leased = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE lease_token = %s", [token]
        ).fetchone()
        stmt = getattr(S, "mark_published", S.mark)
        params = {"ids": ids, "token": token, "actions": ["published"] * len(ids),
                  "delays": [0.0] * len(ids), "errors": [None] * len(ids)}  # fmt: skip
        mark_plan = [r[0] for r in conn.execute(b"EXPLAIN (ANALYZE, BUFFERS) " + stmt, params)]
    return {"claim_plan": claim_plan, "claim_rows": len(ids),
            "claim_rows_leased": leased[0] if leased else None,
            "mark_plan": mark_plan}  # fmt: skip


async def loop(url: str) -> dict[str, Any]:
    """Claim and mark one after the other until nothing is left; per statement per message."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await relay_session(conn)
        after = ("", "")
        claim_s: list[float] = []
        mark_s: list[float] = []
        sizes: list[int] = []
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            claim = await claim_batch(conn, S, CONFIG, after)
            t1 = time.perf_counter()
            after = resume_point(claim, CONFIG)
            if claim is None:
                break
            outcomes = [Outcome(e.id, "published") for e in claim.envelopes]
            await mark_batch(conn, S, claim.token, outcomes)
            claim_s.append(t1 - t0)
            mark_s.append(time.perf_counter() - t1)
            sizes.append(len(claim.envelopes))
        took = time.perf_counter() - started
    n = sum(sizes)
    return {"messages": n, "claims": len(sizes), "seconds": round(took, 3),
            "msg_per_s": round(n / took),
            "claim_us_per_msg": round(sum(claim_s) / n * 1e6, 1),
            "mark_us_per_msg": round(sum(mark_s) / n * 1e6, 1),
            "claim_ms_median": round(statistics.median(claim_s) * 1000, 2),
            "mark_ms_median": round(statistics.median(mark_s) * 1000, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin", default=relay_e2e.ADMIN)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="polling_profile")
    args = parser.parse_args()
    relay_e2e.ADMIN = args.admin
    runs: list[dict[str, Any]] = []
    plans: dict[str, Any] = {}
    for r in range(args.rounds):
        name, url = relay_e2e.create_db()
        try:
            relay_e2e.fill(url, "t", args.messages, args.keys)
            if r == 0:
                plans = explain(url)
                relay_e2e.drop_db(name)
                name, url = relay_e2e.create_db()
                relay_e2e.fill(url, "t", args.messages, args.keys)
            runs.append(asyncio.run(loop(url)))
        finally:
            relay_e2e.drop_db(name)
        print(runs[-1], flush=True)
    med = {k: statistics.median(run[k] for run in runs) for k in runs[0] if k != "messages"}
    result = {"what": "the 'polling' claim and mark alone, one after the other, no broker",
              "messages": args.messages, "keys": args.keys, "rounds": args.rounds,
              "batch_size": CONFIG.batch_size, "per_key_batch": CONFIG.per_key_batch,
              "medians": med, "runs": runs, **plans}  # fmt: skip
    print(write_result(args.name, result))


if __name__ == "__main__":
    main()
