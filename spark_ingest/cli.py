"""``outbox reconcile``, ``outbox ingest`` and ``outbox redrive``.

pyspark is imported only inside the commands that need it, so ``outbox --help`` works without it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from outbox.exceptions import ConfigurationError
from spark_ingest._config import (
    DEFAULT_ROWS_PER_PARTITION,
    JobConfig,
    Source,
    Window,
    check_inboxes,
    check_thresholds,
    load_toml,
    parse_duration,
    previous_day,
)

__all__ = ["commands", "ingest_cmd", "reconcile_cmd", "redrive_cmd"]


def _parse_time(text: str | None, flag: str) -> dt.datetime | None:
    if text is None:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigurationError(
            f"{flag} {text!r}: not a time; use ISO 8601, e.g. 2026-11-20T00:00:00+00:00"
        ) from exc
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _subscriptions(items: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``--subscribe`` values; a topic given twice gets the consumers of both (merged)."""
    subs: dict[str, dict[str, None]] = {}
    for item in items:
        topic, sep, consumers = item.partition("=")
        names = [c.strip() for c in consumers.split(",") if c.strip()]
        if not sep or not topic.strip() or not names:
            raise ConfigurationError(
                f"--subscribe {item!r}: use TOPIC=consumer1,consumer2 (e.g. orders=billing)"
            )
        subs.setdefault(topic.strip(), {}).update(dict.fromkeys(names))
    return {topic: tuple(names) for topic, names in subs.items()}


def _thresholds(items: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, sep, limit = item.partition("=")
        if not sep or not limit.strip().isdigit():
            raise ConfigurationError(
                f"--fail-above {item!r}: use CLASS=N with N a whole number >= 0 (e.g. duplicate=10)"
            )
        out[name.strip()] = int(limit)
    check_thresholds(out, "--fail-above")
    return out


def _sources(
    file: dict[str, Any], outbox: str | None, inboxes: tuple[str, ...], opts: dict[str, Any]
) -> tuple[Source, tuple[Source, ...]]:
    """The sources from the flags, else the file's; ``--user``, ``--password-env``,
    ``--password-file`` and ``--schema`` apply to every source and win over the file's."""
    common = {k: opts[k] for k in ("user", "password_env", "password_file", "schema") if opts[k]}
    if "password_env" in common or "password_file" in common:  # one password source, the flag's
        common = {"password_env": None, "password_file": None} | common
    if not outbox and file.get("outbox") is None:  # the same default as every command's
        outbox = os.environ.get("OUTBOX_DATABASE_URL") or os.environ.get("DATABASE_URL")
    ob = Source("outbox", outbox, **common) if outbox else file.get("outbox")
    ibs = (
        tuple(Source(f"inbox{i + 1}", u, **common) for i, u in enumerate(inboxes))
        if inboxes
        else tuple(replace(src, **common) for src in file.get("inboxes", ()))
    )
    if ob is None:
        raise ConfigurationError("no outbox source: pass --outbox jdbc:postgresql://host/db")
    check_inboxes(ibs)
    return replace(ob, **common), ibs


_common = [
    click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False),
        help="TOML job file: [outbox], [[inbox]], [subscriptions], sla, [thresholds].",
    ),
    click.option(
        "--outbox",
        "outbox_url",
        help="Outbox database: postgresql://host:5432/db (also jdbc:postgresql://, "
        "postgresql+psycopg://, 'host=... dbname=...'; default: $OUTBOX_DATABASE_URL, else "
        "$DATABASE_URL).",
    ),
    click.option("--inbox", "inbox_urls", multiple=True, help="An inbox database (repeatable)."),
    click.option("--user", help="Database user for the sources given on the command line."),
    click.option("--password-env", help="Environment variable holding their password."),
    click.option("--password-file", help="File holding their password."),
    click.option("--schema", default=None, help="Schema of the outbox/inbox tables."),
    click.option(
        "--master", default=None, help="Spark master (default: Spark's config, else local[*])."
    ),
    click.option(
        "--jdbc-jar",
        default=None,
        help="PostgreSQL JDBC jar (default: $OUTBOX_JDBC_JAR, "
        "else /usr/share/java/postgresql.jar).",
    ),
]


def _with_common(f: Any) -> Any:
    for option in reversed(_common):
        f = option(f)
    return f


@click.command("reconcile")
@_with_common
@click.option("--subscribe", multiple=True, help="TOPIC=consumer1,consumer2 (repeatable).")
@click.option(
    "--since",
    help="Window start (default: yesterday 00:00 UTC, or earlier: the oldest message the last "
    "recorded run could not judge for good).",
)
@click.option("--until", help="Window end, exclusive (default: today 00:00 UTC).")
@click.option("--sla", default=None, help="Time after which unprocessed means lost (default 1h).")
@click.option("--fail-above", multiple=True, help="CLASS=N: fail when CLASS exceeds N (default 0).")
@click.option("--output", default="reconciliation", show_default=True, help="Output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON summary instead of text.")
@click.option("--no-record", is_flag=True, help="Do not write a row in outbox_reconciliation_runs.")
def reconcile_cmd(**opts: Any) -> None:
    """Check that every message of a window reached every expected consumer exactly once.

    Exit status: 0 clean, 1 discrepancies above the thresholds, 2 bad configuration or source.
    """
    from spark_ingest._job import reconcile
    from spark_ingest._outputs import format_summary
    from spark_ingest._session import spark_session

    config = _job_config(opts)
    spark = spark_session(master=opts["master"], jdbc_jar=opts["jdbc_jar"])
    result = reconcile(spark, config, opts["output"], record=not opts["no_record"])
    if opts["as_json"]:
        click.echo(json.dumps(result.summary, indent=2, default=str))
    else:
        click.echo(format_summary(result.summary))
    sys.exit(result.exit_code)


def _job_config(opts: dict[str, Any]) -> JobConfig:
    file = load_toml(opts["config_file"]) if opts["config_file"] else {}
    outbox, inboxes = _sources(file, opts["outbox_url"], opts["inbox_urls"], opts)
    default = previous_day()
    since = _parse_time(opts["since"], "--since")
    window = Window(since or default.start, _parse_time(opts["until"], "--until") or default.end)
    config = JobConfig(
        outbox=outbox,
        inboxes=inboxes,
        subscriptions=_subscriptions(opts["subscribe"]) or file.get("subscriptions", {}),
        window=window,
        sla=(
            parse_duration(opts["sla"], what="--sla")
            if opts["sla"]
            else file.get("sla", dt.timedelta(hours=1))
        ),
        thresholds=file.get("thresholds", {}) | _thresholds(opts["fail_above"]),
        rows_per_partition=file.get("rows_per_partition", DEFAULT_ROWS_PER_PARTITION),
    )
    if since is None:
        # Messages the last run left in flight, lagging or deferred are judged now, not never.
        # (After every other check: a bad flag is reported before any database is asked.)
        from spark_ingest._outputs import carried_start

        start = carried_start(outbox, window.start)
        if start < window.start:
            config = replace(config, window=Window(start, window.end))
    return config


@click.command("ingest")
@_with_common
@click.option("--lake", required=True, help="Parquet lake directory (partitioned by date).")
def ingest_cmd(**opts: Any) -> None:
    """Land new outbox and inbox rows in a Parquet lake, from a watermark per source."""
    from spark_ingest._ingest import ingest
    from spark_ingest._session import spark_session

    file = load_toml(opts["config_file"]) if opts["config_file"] else {}
    outbox, inboxes = _sources(file, opts["outbox_url"], opts["inbox_urls"], opts)
    spark = spark_session(master=opts["master"], jdbc_jar=opts["jdbc_jar"])
    for landed in ingest(spark, opts["lake"], outbox, inboxes):
        click.echo(
            f"{landed.source} {landed.table}: {landed.rows} rows "
            f"(watermark {landed.previous} -> {landed.watermark})"
        )


@click.command("redrive")
@click.argument("ids_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--url", default=None, help="Outbox database (default: $OUTBOX_DATABASE_URL).")
@click.option("--schema", default=None, envvar="OUTBOX_SCHEMA", help="Schema of the outbox.")
@click.option("--dry-run", is_flag=True, help="Show what would be re-queued; change nothing.")
@click.option("--reason", default=None, help="Why (kept in the audit).")
@click.option("--actor", default=None, help="Who (default: user@host).")
def redrive_cmd(
    ids_file: Path,
    url: str | None,
    schema: str | None,
    dry_run: bool,
    reason: str | None,
    actor: str | None,
) -> None:
    """Re-queue the message ids in IDS_FILE (e.g. a run's redrive.txt) for the relay.

    The ids stay the same, so an inbox that did receive a message drops the copy. Each
    re-queued message gets an audit row (`outbox dead audit` lists them).
    """
    import psycopg

    from outbox.cli import database_url
    from spark_ingest._redrive import read_id_file, redrive, wait_for_wakeup

    ids = read_id_file(ids_file)
    with psycopg.connect(database_url(url)) as conn:
        result = redrive(conn, ids, schema=schema, dry_run=dry_run, actor=actor, reason=reason)
        if dry_run:
            conn.rollback()
        else:
            conn.commit()
            if result.requeued:
                wait_for_wakeup(conn)  # the doorbell sends it; this process is about to exit
    verb = "would re-queue" if dry_run else "re-queued"
    click.echo(
        f"{verb} {len(result.requeued)}; already pending {len(result.already_pending)}; "
        f"not found {len(result.missing)}"
    )
    for missing in result.missing:
        click.echo(f"not found: {missing}", err=True)


commands = [reconcile_cmd, ingest_cmd, redrive_cmd]
