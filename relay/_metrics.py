"""Prometheus metrics and the health endpoint (optional extra ``metrics``).

Without prometheus-client installed, or without ``metrics_port``, the relay uses no-op metrics
that cost nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import psycopg
from psycopg.rows import class_row, dict_row

from outbox.exceptions import ConfigurationError
from outbox.kit import NoopMetric
from relay._slot import SLOT_STATES, SlotHealth
from relay._statements import RelayStatements

__all__ = ["MetricsServer", "RelayMetrics"]

log = logging.getLogger("relay")


class RelayMetrics:
    """The relay's counters, gauges and histograms."""

    def __init__(self, registry: Any | None) -> None:
        self.registry = registry
        if registry is None:
            noop: Any = NoopMetric()
            self.published = self.failed = self.dead = self.fenced = noop
            self.claim_seconds = self.batch_seconds = noop
            self.backlog = self.oldest_pending = self.dead_rows = noop
            self.destination_paused = self.destination_errors = noop
            self.slot_lag = self.slot_retained = self.slot_active = noop
            self.slot_ok = self.slot_state = noop
            self.capture_recovered = self.capture_pending = noop
            self.heartbeat = self.broker_unreachable = self.broker_changed = noop
            self.reconciliation_finished = self.reconciliation_failed = noop
            self.reconciliation_discrepancies = noop
            return
        kw: dict[str, Any] = {"registry": registry}
        self._declare_relay(kw)
        self._declare_reconciliation(kw)
        self._declare_slot(kw)
        #: False once the database refused the runs table (a role granted before the relay
        #: read it): asked no more, said once
        self._read_runs = True
        #: the topics the last heartbeat found a pending or dead row of
        self._topics: set[str] = set()
        #: the (slot, database) the slot_state series were last set for
        self._slot_labels: tuple[str, str] | None = None

    def _declare_relay(self, kw: dict[str, Any]) -> None:
        """The publishing counters and the backlog, destination and liveness gauges."""
        from prometheus_client import Counter, Gauge, Histogram

        self.published = Counter(
            "outbox_relay_published", "Messages confirmed by the broker", ["topic"], **kw
        )
        self.failed = Counter(
            "outbox_relay_failed", "Publish attempts that failed", ["topic"], **kw
        )
        self.dead = Counter("outbox_relay_dead", "Messages dead-lettered", ["topic"], **kw)
        self.fenced = Counter(
            "outbox_relay_fenced", "Marks refused because another relay took the lease", **kw
        )
        self.claim_seconds = Histogram(
            "outbox_relay_claim_seconds", "Duration of one claim statement", **kw
        )
        self.batch_seconds = Histogram(
            "outbox_relay_batch_seconds", "Claim-to-mark duration of one batch", **kw
        )
        self.backlog = Gauge("outbox_backlog", "Pending messages", ["topic"], **kw)
        self.oldest_pending = Gauge(
            "outbox_oldest_pending_seconds", "Age of the oldest pending message", ["topic"], **kw
        )
        self.dead_rows = Gauge("outbox_dead_messages", "Dead messages", ["topic"], **kw)
        self.destination_paused = Gauge(
            "outbox_relay_destination_paused",
            "1 while the topic's destination refuses messages (the topic is paused)",
            ["topic"],
            **kw,
        )
        self.destination_errors = Counter(
            "outbox_relay_destination_errors",
            "Batches in which the topic's destination refused messages",
            ["topic"],
            **kw,
        )
        self.heartbeat = Gauge(
            "outbox_relay_heartbeat_timestamp_seconds",
            "Unix time of the relay's last heartbeat that the database answered: a value that "
            "stops moving is a relay that is stuck or cut off from its database",
            **kw,
        )
        self.broker_unreachable = Gauge(
            "outbox_relay_broker_unreachable",
            "1 while claims pause because the broker is unreachable (nothing is tried or "
            "counted), 0 once it acknowledges a message again",
            **kw,
        )
        self.broker_changed = Gauge(
            "outbox_relay_broker_state_since_timestamp_seconds",
            "Unix time at which outbox_relay_broker_unreachable last changed (or the relay "
            "first reached or failed to reach the broker)",
            **kw,
        )

    def _declare_reconciliation(self, kw: dict[str, Any]) -> None:
        from prometheus_client import Gauge

        # The nightly reconciliation's latest recorded run (outbox_reconciliation_runs), read
        # on every heartbeat. Until one is read all three are 0: a timestamp of 0 is "no run",
        # which the missing-run alert sees like a run too old.
        self.reconciliation_finished = Gauge(
            "outbox_reconciliation_last_run_timestamp_seconds",
            "Unix time the latest recorded reconciliation run finished (0: none recorded, or "
            "the relay may not read the runs)",
            **kw,
        )
        self.reconciliation_failed = Gauge(
            "outbox_reconciliation_last_run_failed",
            "1 when the latest reconciliation run's outcome is failed (a class of "
            "discrepancies over its threshold), else 0",
            **kw,
        )
        self.reconciliation_discrepancies = Gauge(
            "outbox_reconciliation_last_run_discrepancies",
            "Discrepancies the latest reconciliation run found",
            **kw,
        )

    def _declare_slot(self, kw: dict[str, Any]) -> None:
        from prometheus_client import Counter, Gauge

        # WAL capture mode (docs/explanation/capture.md): the replication slot, read on every
        # heartbeat
        self.slot_lag = Gauge(
            "outbox_capture_slot_lag_bytes",
            "WAL written since the slot's confirmed position: what the relay has not captured",
            ["slot"],
            **kw,
        )
        self.slot_retained = Gauge(
            "outbox_capture_slot_retained_bytes",
            "WAL the server keeps for the slot (compare with max_slot_wal_keep_size)",
            ["slot"],
            **kw,
        )
        self.slot_active = Gauge(
            "outbox_capture_slot_active",
            "1 while a relay streams the slot, 0 when none does, -1 when the slot is missing",
            ["slot"],
            **kw,
        )
        self.slot_ok = Gauge(
            "outbox_capture_slot_ok",
            "0 while the slot cannot capture this database (missing, another database's, "
            "another plugin's, or invalidated) in 'wal' mode, or is invalidated: alert on it",
            ["slot"],
            **kw,
        )
        self.capture_recovered = Counter(
            "outbox_capture_slot_recoveries_total",
            "Times the capturing relay found its slot missing or invalidated, made a fresh one "
            "and published what outbox_wal_pending held (nothing is lost; an alert may note it)",
            ["slot"],
            **kw,
        )
        self.capture_pending = Gauge(
            "outbox_capture_pending_messages",
            "Messages committed that the relay has not numbered and recorded yet "
            "(the ledger, outbox_wal_pending)",
            **kw,
        )
        self.slot_state = Gauge(
            "outbox_capture_slot_state",
            "1 for the slot's state (ok, missing, foreign, plugin, invalidated) and the "
            "database it decodes, 0 for the other states",
            ["slot", "database", "state"],
            **kw,
        )

    @classmethod
    def disabled(cls) -> RelayMetrics:
        return cls(None)

    @classmethod
    def prometheus(cls) -> RelayMetrics:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError as exc:
            raise ConfigurationError(
                "metrics_port is set but prometheus-client is not installed: "
                "pip install 'outbox-inbox[metrics]'"
            ) from exc
        return cls(CollectorRegistry())

    async def refresh_backlog(
        self, conn: psycopg.AsyncConnection[Any], stmts: RelayStatements
    ) -> None:
        if self.registry is None:
            return
        cur = await conn.cursor(row_factory=dict_row).execute(stmts.status_topics)
        topics: set[str] = set()
        for row in await cur.fetchall():
            topic = row["topic"]
            topics.add(topic)
            self.backlog.labels(topic).set(row["pending"])
            self.dead_rows.labels(topic).set(row["dead"])
            self.oldest_pending.labels(topic).set(row["oldest_pending_s"] or 0.0)
        # A topic whose every row is published has no row in status_topics: its gauges go to
        # 0 (not left at their last value, which would keep a backlog alert firing).
        for topic in self._topics - topics:
            for gauge in (self.backlog, self.dead_rows, self.oldest_pending):
                gauge.labels(topic).set(0)
        self._topics = topics
        await self._refresh_slot(conn, stmts)
        await self._refresh_reconciliation(conn, stmts)

    async def _refresh_reconciliation(
        self, conn: psycopg.AsyncConnection[Any], stmts: RelayStatements
    ) -> None:
        if not self._read_runs:
            return
        try:
            async with conn.transaction():  # a refusal must not fail the heartbeat
                cur = conn.cursor(row_factory=dict_row)
                row = await (await cur.execute(stmts.last_reconciliation)).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            self._read_runs = False
            log.warning(
                "relay: the database refused the relay's role SELECT on "
                "outbox_reconciliation_runs, so the outbox_reconciliation_last_run_* gauges "
                "stay 0 (the missing-run alert fires): run `outbox migrate grants --relay ROLE "
                "--apply` again and restart the relay"
            )
            return
        if row is None:
            return
        self.reconciliation_finished.set(row["finished"])
        self.reconciliation_failed.set(0 if row["ok"] else 1)
        self.reconciliation_discrepancies.set(row["discrepancies"])

    async def _refresh_slot(
        self, conn: psycopg.AsyncConnection[Any], stmts: RelayStatements
    ) -> None:
        named = conn.cursor(row_factory=dict_row)
        row = await (await named.execute(stmts.capture_mode)).fetchone()
        mode, slot_name = (row["mode"], row["slot"]) if row is not None else (None, None)
        # the ledger's backlog, in both modes
        counting = conn.cursor(row_factory=dict_row)
        counted = await (await counting.execute(stmts.capture_pending_count)).fetchone()
        self.capture_pending.set(int(counted["messages"]) if counted else 0)
        if slot_name is None:
            return  # never switched to 'wal': no slot to watch
        async with conn.cursor(row_factory=class_row(SlotHealth)) as cur:
            slot = await (await cur.execute(stmts.capture_slot, {"slot": slot_name})).fetchone()
        assert slot is not None  # one row, also for a missing slot
        labels = (slot_name, slot.database or "")
        if labels != self._slot_labels:
            # Series only for the slot (and database) the mode row names now: a slot left
            # behind must not keep an alert firing.
            for gauge in (
                self.slot_ok, self.slot_state, self.slot_active, self.slot_lag,
                self.slot_retained,
            ):  # fmt: skip
                gauge.clear()
            self._slot_labels = labels
        self.slot_ok.labels(slot_name).set(0 if slot.problem(str(mode)) else 1)
        for state in SLOT_STATES:
            self.slot_state.labels(*labels, state).set(1 if state == slot.state else 0)
        if not slot.own:  # missing, or another database's: its lag says nothing of ours
            self.slot_active.labels(slot_name).set(-1)
            return
        self.slot_active.labels(slot_name).set(1 if slot.active else 0)
        self.slot_lag.labels(slot_name).set(slot.lag_bytes or 0)
        self.slot_retained.labels(slot_name).set(slot.retained_bytes or 0)


class _Registered(Protocol):
    """What the server reads: RelayMetrics, or a fleet's metrics (relay/_fleet.py)."""

    registry: Any


class MetricsServer:
    """``/metrics`` (Prometheus text) and ``/healthz`` (200 while healthy, else 503)."""

    def __init__(
        self, metrics: _Registered, healthy: Callable[[], bool], host: str, port: int
    ) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry: Any = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
                elif self.path.startswith("/healthz"):
                    ok = healthy()
                    body, ctype = (b"ok\n" if ok else b"unhealthy\n"), "text/plain"
                    code = 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.started = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
