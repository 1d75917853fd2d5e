"""Shared by every benchmark: machine and version facts, and writing results as JSON."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Facts a reader needs to judge the numbers: CPU, memory, OS, Python, key packages."""
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem_kb = int(next(ln.split()[1] for ln in meminfo if ln.startswith("MemTotal")))
    except (OSError, StopIteration):
        mem_kb = 0
    try:
        pg = subprocess.run(
            ["psql", "--version"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pg = None
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "psql": pg,
        "packages": {
            d: _version(d)
            for d in (
                "outbox-inbox",
                "sqlalchemy",
                "psycopg",
                "psycopg-binary",
                "alembic",
                "nats-py",
                "aio-pika",
                "confluent-kafka",
                "redis",
                "paho-mqtt",
                "pyspark",
            )
        },
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` with the machine facts and a timestamp."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {
        "benchmark": name,
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        # Other work on the machine skews figures: this says how busy it was when we finished.
        "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()],
        **data,
    }
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path
