"""``outbox inbox ...`` subcommands (loaded through the ``outbox.cli`` entry point group)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import click

from inbox.admin import (
    HeldFilter,
    blocked_keys,
    dead_audit,
    dead_purge,
    dead_retry,
    held_keys,
    partition_leases,
    purge_finished,
)
from outbox.kit import one_line, redact

__all__ = ["commands"]

_field = one_line


@click.group("inbox")
def inbox_group() -> None:
    """Consumer-side inbox maintenance."""


@inbox_group.command("purge")
@click.option(
    "--url",
    default=None,
    help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL).",
)
@click.option("--schema", default=None, envvar="OUTBOX_SCHEMA", help="Schema of the tables.")
@click.option(
    "--older-than-days",
    type=float,
    required=True,
    help="Delete finished records older than this. Must exceed the longest redelivery and "
    "the reconciliation window.",
)
@click.option("--consumer", default=None, help="Only this consumer's records.")
@click.option("--batch-size", type=int, default=1000, show_default=True)
@click.option("--include-dead", is_flag=True, help="Also delete dead (poison) records.")
def purge_command(
    url: str | None,
    schema: str | None,
    older_than_days: float,
    consumer: str | None,
    batch_size: int,
    include_dead: bool,
) -> None:
    """Delete old processed inbox records in batches."""
    from outbox.cli import database_url  # here, not at import: outbox.cli loads this module

    deleted = purge_finished(
        database_url(url),
        older_than=dt.timedelta(days=older_than_days),
        consumer=consumer,
        batch_size=batch_size,
        include_dead=include_dead,
        schema=schema,
    )
    click.echo(f"deleted {deleted} inbox records")


@inbox_group.command("blocked")
@click.option(
    "--url",
    default=None,
    help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL).",
)
@click.option("--schema", default=None, envvar="OUTBOX_SCHEMA", help="Schema of the tables.")
@click.option("--consumer", default=None, help="Only this consumer's keys.")
@click.option(
    "--min-age-seconds",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="List keys that have waited at least this long for their next message.",
)
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def blocked_command(
    url: str | None,
    schema: str | None,
    consumer: str | None,
    min_age_seconds: float,
    limit: int,
    as_json: bool,
) -> None:
    """List ordered keys whose next message keeps arriving out of order, one line per key.

    Exit status 1 when any key is listed, so a cron job or a probe can alert on it.
    """
    from outbox.cli import database_url  # here, not at import: outbox.cli loads this module

    keys = blocked_keys(
        database_url(url),
        consumer=consumer,
        min_age=dt.timedelta(seconds=min_age_seconds),
        limit=limit,
        schema=schema,
    )
    if as_json:
        click.echo(json.dumps([k.as_dict() for k in keys], default=str))
    else:
        for k in keys:
            dead = f" dead={k.dead_id}" if k.dead_id else ""
            if k.origin:  # the database the key's messages come from (docs/how-to/tenants.md)
                dead += f"\torigin={_field(k.origin)}"
            click.echo(
                f"{_field(k.consumer)}\t{_field(k.topic)}\t{_field(k.key)}\tapplied={k.last_seq}"
                f"\twaiting_for={k.last_seq + 1}\tarrived={k.waiting_seq}"
                f"\twaited={int(k.waited.total_seconds())}s\trefused={k.out_of_order}{dead}"
            )
        click.echo(f"{len(keys)} blocked key(s)", err=True)
    if keys:
        raise SystemExit(1)


@inbox_group.command("partitions")
@click.option(
    "--url",
    default=None,
    help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL).",
)
@click.option("--schema", default=None, envvar="OUTBOX_SCHEMA", help="Schema of the tables.")
@click.option("--consumer", default=None, help="Only this consumer's partitions.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def partitions_command(
    url: str | None, schema: str | None, consumer: str | None, as_json: bool
) -> None:
    """List the partitions of partitioned consumers: which process holds each, and for how
    long its lease still holds (docs/how-to/scale-out.md).

    Exit status 1 when a partition is held by no live process, so a probe can alert on it.
    """
    from outbox.cli import database_url  # here, not at import: outbox.cli loads this module

    leases = partition_leases(database_url(url), consumer=consumer, schema=schema)
    if as_json:
        click.echo(json.dumps([lease.as_dict() for lease in leases], default=str))
    else:
        for lease in leases:
            left = lease.expires_in.total_seconds() if lease.expires_in is not None else 0.0
            owner = _field(lease.owner) if lease.held and lease.owner else "-"
            click.echo(
                f"{_field(lease.consumer)}\tpartition={lease.partition}\towner={owner}"
                f"\tepoch={lease.epoch}\tlease_left={left:.1f}s"
            )
        free = sum(1 for lease in leases if not lease.held)
        click.echo(f"{len(leases)} partition(s), {free} held by no live process", err=True)
    if any(not lease.held for lease in leases):
        raise SystemExit(1)


def _url_options(fn: Any) -> Any:
    fn = click.option(
        "--schema", default=None, envvar="OUTBOX_SCHEMA", help="Schema of the tables."
    )(fn)
    return click.option(
        "--url",
        default=None,
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL).",
    )(fn)


def _held_filters(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--consumer", default=None, help="Only this consumer."),
            click.option("--topic", default=None),
            click.option("--key", default=None),
            click.option("--id", "ids", multiple=True, help="Dead message id (repeatable)."),
        ]
    ):
        fn = option(fn)
    return fn


def _held_filter(consumer: str | None, topic: str | None, key: str | None, ids: Any) -> HeldFilter:
    try:
        parsed = [uuid.UUID(i) for i in ids]
    except ValueError as exc:
        raise click.BadParameter(f"not a message id (a UUID): {exc}", param_hint="--id") from exc
    return HeldFilter(consumer=consumer, topic=topic, key=key, ids=parsed)


@inbox_group.command("held")
@_url_options
@_held_filters
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def held_command(
    url: str | None,
    schema: str | None,
    consumer: str | None,
    topic: str | None,
    key: str | None,
    ids: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    """List keys held behind a dead message (on_dead="hold"), one line per key."""
    from outbox.cli import database_url

    where = _held_filter(consumer, topic, key, ids)
    keys = held_keys(database_url(url), where, limit=limit, schema=schema)
    if as_json:
        click.echo(json.dumps([k.as_dict() for k in keys], default=str))
        return
    for k in keys:
        click.echo(
            f"{_field(k.consumer)}\t{_field(k.topic)}\t{_field(k.key)}\tseq={k.seq}"
            f"\tdead={k.message_id}\tparked={k.parked}\theld_at={k.held_at.isoformat()}"
            f"\tdecision={k.decision or '-'}\terror={_field(redact(k.last_error or ''))}"
        )
    click.echo(f"{len(keys)} held key(s)", err=True)


@inbox_group.group("dead")
def dead_group() -> None:
    """The inbox's dead messages that hold their key: retry, purge, audit (like `outbox dead`)."""


def _decision_command(name: str, decide: Any, help_text: str) -> click.Command:
    @click.command(name, help=help_text)
    @_url_options
    @_held_filters
    @click.option("--reason", default=None, help="Why (kept in the audit).")
    @click.option("--actor", default=None, help="Who (default: user@host).")
    @click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
    @click.option("--all", "everything", is_flag=True, help="Required when no filter is given.")
    @click.option("--limit", type=click.IntRange(min=1), default=10_000, show_default=True)
    def cmd(
        url: str | None,
        schema: str | None,
        consumer: str | None,
        topic: str | None,
        key: str | None,
        ids: tuple[str, ...],
        reason: str | None,
        actor: str | None,
        dry_run: bool,
        everything: bool,
        limit: int,
    ) -> None:
        from outbox.cli import database_url

        where = _held_filter(consumer, topic, key, ids)
        if where.empty and not everything:
            raise click.UsageError(
                f"{name} every held dead message? Pass --all, or narrow it with --consumer, "
                "--topic, --key or --id"
            )
        changed = decide(
            database_url(url),
            where,
            reason=reason,
            actor=actor,
            limit=limit,
            dry_run=dry_run,
            schema=schema,
        )
        for message_id in changed:
            click.echo(str(message_id))
        verb = f"would {name}" if dry_run else f"{name} decided"
        click.echo(f"{verb}: {len(changed)} message(s)", err=True)
        if ids and not changed:
            raise click.ClickException(
                "no held dead message matched: `outbox inbox held` lists them (a dead message "
                "of a consumer with on_dead='skip' holds nothing: its key has moved on)"
            )

    return cmd


dead_group.add_command(
    _decision_command(
        "retry",
        dead_retry,
        "Retry held dead messages: the consumer applies each again, then its key's parked "
        "messages in seq order.",
    )
)
dead_group.add_command(
    _decision_command(
        "purge",
        dead_purge,
        "Purge held dead messages: the consumer moves each key on without their effect, then "
        "applies the parked messages in seq order.",
    )
)


@dead_group.command("audit")
@_url_options
@click.option("--consumer", default=None, help="Only this consumer.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def dead_audit_command(
    url: str | None, schema: str | None, consumer: str | None, limit: int, as_json: bool
) -> None:
    """Who decided what about held dead messages, when and why; what the consumer did."""
    from outbox.cli import database_url

    rows = dead_audit(database_url(url), consumer=consumer, limit=limit, schema=schema)
    if as_json:
        click.echo(json.dumps(rows, default=str))
        return
    for r in rows:
        click.echo(
            f"{r['at'].isoformat()}\t{_field(r['actor'])}\t{r['action']}"
            f"\t{_field(r['consumer'])}\t{r['message_id']}\t{_field(r['topic'])}"
            f"\t{_field(r['key'])}\tseq={r['seq']}\treason={_field(r['reason'] or '')}"
        )


commands = [inbox_group]
