"""Shared by every benchmark: machine and version facts, writing results as JSON, and a private
PostgreSQL cluster with logical decoding for the benches that need one."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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
                "orjson",
                "uuid-utils",
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


def load_file(name: str, path: Path) -> Any:
    """The module in ``path``, imported as ``name`` without putting its directory on sys.path
    (bench/ and tests/ hold modules that would shadow the relay package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def logical_cluster(prefix: str) -> Iterator[Any]:
    """A private PostgreSQL cluster with wal_level = logical and the server's default
    durability (tests/support/harness.py), on a free port, stopped at the end; the machine's own
    server is never reconfigured. Exits saying what to install when there are no server binaries."""
    harness = sys.modules.get("harness") or load_file(
        "harness", Path(__file__).resolve().parent.parent / "tests" / "support" / "harness.py"
    )
    with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
        server = harness.logical_server(workdir, durable=True)
        if server is None:
            sys.exit(harness.LOGICAL_HOW_TO)
        try:
            yield server
        finally:
            server.stop()
