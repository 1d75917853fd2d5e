"""`outbox relay`, `outbox status`, `outbox dead ...`, `outbox retention` (click commands).

``outbox.cli`` adds :data:`commands` to the ``outbox`` group through the ``outbox.cli`` entry
point; ``python -m relay`` runs the same commands. This module must not import ``outbox.cli``
at import time: importing ``outbox.cli`` loads that entry point, i.e. this module, which would
then be only half imported (``python -m relay --help`` failed that way).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import time
import uuid
from typing import Any

import click

from outbox.exceptions import ConfigurationError
from outbox.kit import one_line, redact
from relay._admin import (
    DeadFilter,
    audit_log,
    dead_list,
    dead_purge,
    dead_retry,
    delete_published,
    disable_capture,
    enable_capture,
    relay_status,
)
from relay._broker_config import publisher_kwargs
from relay._config import RelayConfig
from relay._logs import configure_logging
from relay._metrics import MetricsServer, RelayMetrics
from relay._relay import Relay
from relay._replay import DEFAULT_DESTINATION, ReplayProgress, replay
from relay.brokers.base import Publisher

__all__ = ["commands", "dead_group", "relay_cmd", "replay_cmd", "retention_cmd", "status_cmd"]

_relay_url = click.option(
    "--url",
    default=None,
    help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL).",
)
_url = click.option(
    "--url",
    default=None,
    help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL).",
)
_schema = click.option(
    "--schema", default=None, envvar="OUTBOX_SCHEMA", help="Schema of the tables."
)


def _schemes_text() -> str:
    from relay.brokers import SCHEMES

    shown = [s for s in SCHEMES if s != "memory"]
    return ", ".join(f"{s}:" if s in ("stdout", "file") else f"{s}://" for s in shown)


_SCHEMES_TEXT = _schemes_text()


def database_url(url: str | None) -> str:
    """The database URL from the flag or the environment (``outbox.cli.database_url``)."""
    from outbox.cli import database_url as from_flag_or_env  # see the module docstring

    return from_flag_or_env(url)


def make_publisher(config: RelayConfig) -> Publisher:
    """The broker adapter for ``config.broker_url`` (relay.brokers.publisher_for_url), in a
    ClaimCheckPublisher when the config has a ``[claim_check]`` table."""
    if not config.broker_url:
        raise ConfigurationError(
            f"no broker: pass --broker nats://host:4222 (or {_SCHEMES_TEXT}), set "
            "OUTBOX_BROKER_URL, or broker in the config file"
        )
    try:
        from relay import brokers
    except ImportError as exc:  # pragma: no cover
        raise ConfigurationError(f"broker adapters unavailable: {exc}") from exc
    factory = getattr(brokers, "publisher_for_url", None)
    if factory is None:
        raise ConfigurationError(
            "this installation has no broker adapters (relay.brokers.publisher_for_url)"
        )
    # the adapter must give up on a message before the relay gives up on the batch (see Relay)
    budget = min(config.publish_timeout, config.lease_seconds * 0.9)
    url, options = publisher_kwargs(config.broker_url, config.broker_options)
    publisher: Publisher = factory(
        url,
        destinations=dict(config.destinations) or None,
        partitions=dict(config.partitions) or None,
        ack_timeout=round(budget * 0.8, 3),
        **options,
    )
    if config.claim_check is not None:  # payloads over the threshold go to the store first
        from relay._claimcheck import ClaimCheckPublisher
        from relay._claimcheck_config import build_claim_check

        return ClaimCheckPublisher(publisher, build_claim_check(config.claim_check))
    return publisher


async def _serve(relay: Relay) -> None:
    relay.install_signal_handlers()
    await relay.run()


def _relay_options(fn: Any) -> Any:
    for opt in reversed(
        [
            _relay_url,
            click.option(
                "--broker",
                default=None,
                help=f"Broker URL: {_SCHEMES_TEXT} (amqp:// is RabbitMQ, amqp1:// AMQP 1.0; "
                "sqs://REGION, file:/path; default: $OUTBOX_BROKER_URL; its options: the "
                "config file's [broker] table).",
            ),
            click.option(
                "--config",
                "config_file",
                default=None,
                type=click.Path(dir_okay=False),
                help="TOML file (flags and OUTBOX_* variables override it).",
            ),
            _schema,
            click.option(
                "--relay-id", default=None, help="Name of this relay (default: host-pid-random)."
            ),
            click.option("--batch-size", type=int, default=None),
            click.option("--lease-seconds", type=float, default=None),
            click.option("--poll-interval", type=float, default=None),
            click.option(
                "--retention-seconds",
                type=float,
                default=None,
                help="Delete published rows older than this (default: keep).",
            ),
            click.option(
                "--metrics-port", type=int, default=None, help="Serve /metrics and /healthz here."
            ),
            click.option("--log-format", type=click.Choice(["text", "json"]), default="text"),
            click.option("--log-level", default="info"),
        ]
    ):
        fn = opt(fn)
    return fn


def _load(
    url: str | None, broker: str | None, config_file: str | None, flags: dict[str, Any]
) -> RelayConfig:
    if url:
        flags["database_url"] = url
    return RelayConfig.load(config_file, broker_url=broker, **flags)


@click.group("relay", invoke_without_command=True)
@_relay_options
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Do what `outbox relay check` does, then exit.",
)
@click.pass_context
def relay_cmd(
    ctx: click.Context,
    /,
    url: str | None,
    broker: str | None,
    config_file: str | None,
    log_format: str,
    log_level: str,
    check_only: bool,
    **flags: Any,
) -> None:
    """Publish committed outbox messages to the broker, until SIGTERM/SIGINT.

    `outbox relay check` (same options) checks the configuration, the database and the
    broker's destinations without publishing."""
    if ctx.invoked_subcommand is not None:
        return
    configure_logging(log_level, log_format)
    config = _load(url, broker, config_file, flags)
    if check_only:
        _run_check(config, ())
        return
    metrics = RelayMetrics.prometheus() if config.metrics_port is not None else None
    relay = Relay(config, make_publisher(config), metrics=metrics)
    server = None
    if metrics is not None and config.metrics_port is not None:
        server = MetricsServer(
            metrics, lambda: _healthy(relay), config.metrics_host, config.metrics_port
        )
        server.start()
    try:
        asyncio.run(_serve(relay))
    finally:
        if server is not None:
            server.close()


@relay_cmd.command("check")
@_relay_options
@click.option("--topic", "topics", multiple=True, help="Check this topic too (repeatable).")
@click.pass_context
def relay_check_cmd(ctx: click.Context, /, topics: tuple[str, ...], **flags: Any) -> None:
    """Load the relay's configuration, connect to the database and the broker, and print per
    topic where the relay would publish and whether that destination exists; publishes
    nothing. Exits 0 when everything was found, 1 otherwise."""
    parent = ctx.parent.params if ctx.parent is not None else {}
    # the options given before `check` (outbox relay --config f check) count too
    url, broker, config_file = (
        flags.pop(name) or parent.get(name) for name in ("url", "broker", "config_file")
    )
    log_format, log_level = flags.pop("log_format"), flags.pop("log_level")
    for name, value in parent.items():
        if name in flags and flags[name] is None:
            flags[name] = value
    configure_logging("warning" if log_level == "info" else log_level, log_format)
    _run_check(_load(url, broker, config_file, flags), topics)


def _run_check(config: RelayConfig, topics: tuple[str, ...]) -> None:
    from relay._check import check_relay

    if not config.broker_url:
        make_publisher(config)  # the one-line "no broker" error
    report = asyncio.run(check_relay(config, make_publisher, extra_topics=topics))
    for line in report.lines:
        click.echo(line)
    sys.exit(0 if report.ok else 1)


def _healthy(relay: Relay) -> bool:
    import time

    window = max(relay.config.poll_interval, relay.config.heartbeat_interval) * 3 + 5
    return not relay.stopping and time.monotonic() - relay.last_db_ok < window


@click.command("status")
@_url
@_schema
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status_cmd(url: str | None, schema: str | None, as_json: bool) -> None:
    """Backlog per topic, oldest pending age, dead count, live relays and what they hold."""
    status = relay_status(database_url(url), schema=schema)
    if as_json:
        document = {
            "topics": status.topics,
            "relays": status.relays,
            "paused_destinations": status.paused_destinations,
            "capture": status.capture,
        }
        click.echo(redact(json.dumps(document, default=str)))
        return
    click.echo(f"{'topic':<24} {'pending':>8} {'leased':>7} {'dead':>6} {'oldest pending':>15}")
    for t in status.topics:
        oldest = f"{t['oldest_pending_s']:.1f}s" if t["oldest_pending_s"] is not None else "-"
        topic = one_line(t["topic"])
        click.echo(f"{topic:<24} {t['pending']:>8} {t['leased']:>7} {t['dead']:>6} {oldest:>15}")
    click.echo("")
    click.echo(f"{'relay':<36} {'pid':>7} {'last seen':>10} {'leased':>7}  topics")
    for r in status.relays:
        topics = ",".join(one_line(t) for t in r["topics"] or [])
        relay_id = one_line(r["relay_id"])
        click.echo(
            f"{relay_id:<36} {r['pid']:>7} {r['silent_s']:>9.1f}s {r['leased']:>7}  {topics}"
        )
        if r.get("broker"):  # registered redacted, masked again by relay_status
            click.echo(
                f"{'':<4}broker: {r['broker_kind']}, {one_line(redact(r['broker']))}"
                f"{_reachability(r)}"
            )
    click.echo("")
    click.echo(_capture_line(status.capture))
    paused = status.paused_destinations
    if paused:
        click.echo("")
        click.echo("paused topics (their destination refuses messages; the others flow):")
        for p in paused:
            where = f" -> {one_line(redact(p['destination']))}" if p.get("destination") else ""
            kind = f" on {p['broker_kind']}" if p.get("broker_kind") else ""
            click.echo(
                f"{one_line(p['topic'])}{where}{kind} since {p['since']} ({p['refusals']} "
                f"refusals, relay {one_line(p['relay_id'])}): {one_line(redact(p['reason']))}"
            )


def _reachability(relay: dict[str, Any]) -> str:
    """``, reachable since T`` / ``, UNREACHABLE since T: why`` / ``, not reached yet``."""
    up, since = relay.get("broker_reachable"), relay.get("broker_since")
    if up is None:
        return ", not reached yet" if since else ""
    if up:
        return f", reachable since {since}"
    return f", UNREACHABLE since {since}: {one_line(redact(relay.get('broker_error') or '?'))}"


def _capture_line(state: dict[str, Any]) -> str:
    """The capture mode in one line: in 'wal' mode the slot, its database, lag and retained
    WAL; a slot that cannot capture this database, in capitals with what to do."""
    mode = state.get("mode") or "polling"
    slot = state.get("slot")
    problem = state.get("problem")
    waiting = state.get("pending_messages") or 0
    pending = (
        f", {waiting} message(s) not yet recorded (outbox_wal_pending, oldest "
        f"{state.get('oldest_pending_seconds') or 0:.1f}s)"
        if waiting
        else ""
    )
    if problem:
        line = f"capture: {mode}, slot {slot} {str(state.get('slot_state')).upper()}: {problem}"
        return line + pending
    if mode != "wal":
        return "capture: polling" + pending
    return (
        f"capture: wal, slot {slot} of database {state['slot_database']} "
        f"{'streaming' if state['active'] else 'idle'}, lag {state['lag_bytes']} bytes, "
        f"WAL retained {state['retained_bytes']} bytes ({state['wal_status']})"
    ) + pending


@click.group("capture")
def capture_group() -> None:
    """How committed messages reach the relay: polling or the WAL (docs/explanation/capture.md)."""


@capture_group.command("enable")
@_url
@_schema
@click.option(
    "--slot",
    default=None,
    help="Logical slot name (default: the database's slot, else outbox_<database>; slot "
    "names are global to the server, so each database needs its own).",
)
@click.option("--publication", default="outbox_capture", show_default=True)
def capture_enable_cmd(
    url: str | None, schema: str | None, slot: str | None, publication: str
) -> None:
    """Switch to WAL capture: create the slot and publication, then flip the mode."""
    state = enable_capture(database_url(url), slot=slot, publication=publication, schema=schema)
    click.echo(_capture_line(state))


@capture_group.command("disable")
@_url
@_schema
def capture_disable_cmd(url: str | None, schema: str | None) -> None:
    """Switch back to polling (the slot is kept until you drop it)."""
    click.echo(_capture_line(disable_capture(database_url(url), schema=schema)))


@capture_group.command("status")
@_url
@_schema
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def capture_status_cmd(url: str | None, schema: str | None, as_json: bool) -> None:
    """The capture mode; the slot, the database it decodes, its lag and retained WAL, or what
    keeps it from capturing this database."""
    state = relay_status(database_url(url), schema=schema).capture
    click.echo(json.dumps(state, default=str) if as_json else _capture_line(state))


def _filters(fn: Any) -> Any:
    for opt in reversed(
        [
            click.option("--topic", default=None),
            click.option("--key", default=None),
            click.option("--id", "ids", multiple=True, help="Message id (repeatable)."),
            click.option(
                "--since", type=click.DateTime(), default=None, help="Created at or after."
            ),
            click.option("--until", type=click.DateTime(), default=None, help="Created before."),
            _url,
            _schema,
        ]
    ):
        fn = opt(fn)
    return fn


def _dead_filter(
    topic: str | None,
    key: str | None,
    ids: tuple[str, ...],
    since: dt.datetime | None,
    until: dt.datetime | None,
) -> DeadFilter:
    try:
        parsed = [uuid.UUID(i) for i in ids]
    except ValueError as exc:
        raise click.BadParameter(f"--id must be a message UUID: {exc}") from exc
    tz = dt.UTC
    return DeadFilter(
        topic,
        key,
        parsed or None,
        since.replace(tzinfo=since.tzinfo or tz) if since else None,
        until.replace(tzinfo=until.tzinfo or tz) if until else None,
    )


@click.group("dead")
def dead_group() -> None:
    """Inspect, re-queue or purge dead messages (every change is audited)."""


@dead_group.command("list")
@_filters
@click.option("--limit", type=int, default=100)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def dead_list_cmd(url: str | None, schema: str | None, limit: int, as_json: bool, **f: Any) -> None:
    """List dead messages matching the filters, one line each (or --json)."""
    found = dead_list(database_url(url), _dead_filter(**f), limit=limit, schema=schema)
    if as_json:
        fields = ("id", "topic", "key", "seq", "attempts", "created_at", "last_error")
        rows = [{name: getattr(m, name) for name in fields} for m in found]
        for row in rows:  # an error stored by an older relay may quote a broker URL
            row["last_error"] = redact(row["last_error"]) if row["last_error"] else None
        click.echo(json.dumps(rows, default=str))
        return
    for m in found:
        click.echo(
            f"{m.id}  {one_line(m.topic)}  {one_line(m.key)}  seq={m.seq}  "
            f"attempts={m.attempts}  {m.created_at:%Y-%m-%d %H:%M:%S}  "
            f"{one_line(redact(m.last_error or ''))}"
        )


@dead_group.command("show")
@click.argument("message_id")
@_url
@_schema
def dead_show_cmd(message_id: str, url: str | None, schema: str | None) -> None:
    """Everything about one dead message, payload included."""
    where = _dead_filter(None, None, (message_id,), None, None)
    found = dead_list(database_url(url), where, limit=1, schema=schema)
    if not found:
        raise click.ClickException(f"no dead message with id {message_id}")
    m = found[0]
    click.echo(
        json.dumps(
            {
                "id": str(m.id),
                "topic": m.topic,
                "key": m.key,
                "seq": m.seq,
                "attempts": m.attempts,
                "created_at": m.created_at.isoformat(),
                "last_error": redact(m.last_error) if m.last_error else None,
                "content_type": m.content_type,
                "headers": m.headers,
                "payload": m.payload.decode("utf-8", errors="replace"),
            },
            indent=2,
        )
    )


def _change_cmd(name: str, fn: Any, help_text: str) -> click.Command:
    @click.command(name, help=help_text)
    @_filters
    @click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
    @click.option("--all", "everything", is_flag=True, help="Required when no filter is given.")
    @click.option("--reason", default=None, help="Why (kept in the audit).")
    @click.option("--actor", default=None, help="Who (default: user@host).")
    def cmd(
        url: str | None,
        schema: str | None,
        dry_run: bool,
        everything: bool,
        reason: str | None,
        actor: str | None,
        **f: Any,
    ) -> None:
        where = _dead_filter(**f)
        if where.empty and not everything:
            raise click.UsageError(f"refusing to {name} every dead message: add a filter or --all")
        ids = fn(
            database_url(url), where, actor=actor, reason=reason, dry_run=dry_run, schema=schema
        )
        verb = (
            f"would {name}"
            if dry_run
            else name.replace("retry", "re-queued").replace("purge", "purged")
        )
        for i in ids:
            click.echo(str(i))
        click.echo(f"{verb}: {len(ids)} message(s)", err=True)

    return cmd


dead_group.add_command(_change_cmd("retry", dead_retry, "Re-queue matching dead messages."))
dead_group.add_command(_change_cmd("purge", dead_purge, "Delete matching dead messages."))


@dead_group.command("audit")
@_url
@_schema
@click.option("--limit", type=int, default=50)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def dead_audit_cmd(url: str | None, schema: str | None, limit: int, as_json: bool) -> None:
    """Who re-queued or purged what, newest first, one line each (or --json)."""
    rows = audit_log(database_url(url), limit=limit, schema=schema)
    if as_json:
        click.echo(json.dumps(rows, default=str))
        return
    for r in rows:
        click.echo(
            f"{r['at']:%Y-%m-%d %H:%M:%S}  {one_line(r['actor'])}  {r['action']}  "
            f"{r['message_id']}  {one_line(r['topic'])}/{one_line(r['key'])}#{r['seq']}  "
            f"{one_line(r['reason'] or '')}"
        )


@click.command("retention")
@_url
@_schema
@click.option("--older-than", type=float, required=True, help="Seconds since publication.")
@click.option("--batch", type=int, default=1000, help="Rows per transaction.")
def retention_cmd(url: str | None, schema: str | None, older_than: float, batch: int) -> None:
    """Delete published rows older than --older-than seconds, in small batches."""
    n = delete_published(database_url(url), older_than, batch=batch, schema=schema)
    click.echo(f"deleted {n} published message(s)")


@click.command("replay")
@click.option("--topic", required=True, help="The topic whose retained history to re-publish.")
@click.option("--to", "consumer", required=True, help="The consumer that gets it (its name).")
@click.option(
    "--destination",
    default=DEFAULT_DESTINATION,
    show_default=True,
    help="Where only that consumer reads (subject, stream key, routing key); {topic} and "
    "{consumer} are filled in.",
)
@click.option(
    "--since",
    type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    default=None,
    help="Only messages committed at or after this time (UTC unless it says otherwise).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=1000.0,
    show_default=True,
    help="At most this many messages a second.",
)
@click.option("--batch", type=click.IntRange(min=1), default=500, show_default=True)
@click.option(
    "--broker",
    default=None,
    envvar="OUTBOX_BROKER_URL",
    help="Broker URL (default: $OUTBOX_BROKER_URL), as `outbox relay --broker` takes it.",
)
@click.option("--restart", is_flag=True, help="Forget where an earlier run stopped; start over.")
@click.option("--reason", default=None, help="Why (kept in the audit).")
@click.option("--actor", default=None, help="Who (default: user@host).")
@_url
@_schema
def replay_cmd(
    topic: str,
    consumer: str,
    destination: str,
    since: dt.datetime | None,
    rate: float,
    batch: int,
    broker: str | None,
    restart: bool,
    reason: str | None,
    actor: str | None,
    url: str | None,
    schema: str | None,
) -> None:
    """Re-publish a topic's retained history to a destination only one consumer reads, in
    per-key order, with the same ids (its inbox applies each once). Interrupt it any time:
    run the same command again and it continues where the broker last confirmed.

    Start the consumer first, reading both its live destination and this one."""
    from outbox.kit import remember_secrets

    if not broker:
        raise click.UsageError(
            "no broker: pass --broker nats://host:4222 (or set OUTBOX_BROKER_URL)"
        )
    remember_secrets(broker)
    last = [0.0]

    def progress(p: ReplayProgress) -> None:
        now = time.monotonic()
        if now - last[0] < 1.0 and p.sent < p.total:
            return
        last[0] = now
        share = f" ({100 * p.sent // p.total}%)" if p.total else ""
        click.echo(
            f"replayed {p.sent}/{p.total}{share}  {p.rate:.0f}/s  at key "
            f"{one_line(p.last_key or '')} seq {p.last_seq}",
            err=True,
        )

    run = replay(
        database_url(url),
        broker,
        topic=topic,
        consumer=consumer,
        destination=destination,
        since=since.replace(tzinfo=since.tzinfo or dt.UTC) if since else None,
        rate=rate,
        batch=batch,
        restart=restart,
        actor=actor,
        reason=reason,
        schema=schema,
        broker_options={"ack_timeout": 8.0},
        on_progress=progress,
    )
    try:
        result = asyncio.run(run)
    except KeyboardInterrupt:
        click.echo(
            "interrupted: what the broker confirmed is kept; run the same command again to "
            "continue",
            err=True,
        )
        sys.exit(130)
    resumed = " (continued an earlier run)" if result.resumed else ""
    click.echo(
        f"replayed {result.sent} message(s) of {one_line(topic)} to {one_line(consumer)} at "
        f"{one_line(result.destination)}{resumed}; {result.replayed} in all"
    )


commands: list[click.Command] = [
    relay_cmd,
    status_cmd,
    dead_group,
    retention_cmd,
    capture_group,
    replay_cmd,
]
