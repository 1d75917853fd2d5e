"""``outbox inbox ...`` subcommands (loaded through the ``outbox.cli`` entry point group)."""

from __future__ import annotations

import datetime as dt

import click

from inbox._retention import purge

__all__ = ["commands"]


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

    deleted = purge(
        database_url(url),
        older_than=dt.timedelta(days=older_than_days),
        consumer=consumer,
        batch_size=batch_size,
        include_dead=include_dead,
        schema=schema,
    )
    click.echo(f"deleted {deleted} inbox records")


commands = [inbox_group]
