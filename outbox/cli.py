"""The ``outbox`` command. Later packages add their subcommands to :data:`main`."""

from __future__ import annotations

import inspect
import logging
import os
import sys
import traceback

import click

from outbox import _migrate
from outbox._dburl import libpq_url, url_source
from outbox._errors import describe_cli_error, missing_extra
from outbox._redact import install_log_redaction, redact, remember_secrets
from outbox.exceptions import MissingDependencyError

__all__ = ["database_url", "main"]

log = logging.getLogger("outbox.cli")

_URL_HELP = "PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL)."


def database_url(url: str | None) -> str:
    """The database URL from the flag or the environment, or a clear usage error."""
    source = "--url"
    if not url:
        for var in ("OUTBOX_DATABASE_URL", "DATABASE_URL"):
            if os.environ.get(var):
                url, source = os.environ[var], f"${var}"
                break
    if not url:
        raise click.UsageError(
            "no database given: pass --url postgresql://user@host:5432/dbname "
            "or set OUTBOX_DATABASE_URL (or DATABASE_URL)"
        )
    remember_secrets(url)  # masked wherever a driver's error might quote it
    url_source(source)  # the hints of a later connection error name it
    return libpq_url(url, source)


class _Group(click.Group):
    """Turns library and database errors into one clear line and exit status 2, with every
    secret masked (``outbox._redact``); installs the log redaction for the command's run."""

    def invoke(self, ctx: click.Context) -> object:
        install_log_redaction()
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:  # a usage error quotes the arguments it refused
            exc.message = redact(exc.message)  # type: ignore[misc]  # Final only in the stubs
            raise
        except (click.exceptions.Exit, click.Abort):  # --help, --version, Ctrl-C at a prompt
            raise
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc)
            if extra is None:
                raise  # not an optional extra of ours: shown as it is
            click.echo(
                f"error: this command needs the {extra!r} extra ({exc.name} is not installed): "
                f"pip install 'outbox-inbox[{extra}]'",
                err=True,
            )
            sys.exit(2)
        except Exception as exc:
            line = describe_cli_error(exc)
            if line is None:  # a bug: its traceback, with secrets masked too
                click.echo(redact(traceback.format_exc()), err=True, nl=False)
                sys.exit(1)
            click.echo(f"error: {line}", err=True)
            sys.exit(2)


#: ``outbox --help`` lists the commands by what a user does with them, in this order
SECTIONS = {
    "Set up": ("migrate", "capture"),
    "Run": ("relay", "console"),
    "Operate": ("status", "trace", "dead", "inbox", "replay", "retention"),
    "Reconcile": ("reconcile", "ingest", "redrive"),
}


class _Main(_Group):
    """The ``outbox`` group: its help lists the commands by task, in full sentences."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listed = set()
        for title, names in [*SECTIONS.items(), ("Other", tuple(self.list_commands(ctx)))]:
            rows = []
            for name in names:
                command = self.get_command(ctx, name)
                if command is None or command.hidden or name in listed:
                    continue
                listed.add(name)
                text = inspect.cleandoc(command.help or command.short_help or "")
                rows.append((name, " ".join(text.split("\n\n")[0].split())))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


@click.group(
    cls=_Main,
    epilog="Each command's options: outbox COMMAND --help. The documentation (a tutorial, "
    "how-to guides, the reference of every command and setting) is docs/README.md in the "
    "project's source distribution and repository.",
)
@click.version_option(package_name="outbox-inbox", prog_name="outbox")
def main() -> None:
    """outbox-inbox: transactional outbox and inbox for PostgreSQL.

    Start with `outbox migrate upgrade --url postgresql://user@host:5432/dbname`: it creates
    the tables (the URL may also come from $OUTBOX_DATABASE_URL). Then `outbox relay check`
    and `outbox relay` publish what your services write."""


@main.group()
def migrate() -> None:
    """Install or change the outbox and inbox tables (Alembic revisions on branch 'outbox')."""


_url = click.option("--url", envvar=None, default=None, help=_URL_HELP)
_schema = click.option(
    "--schema",
    default=None,
    envvar="OUTBOX_SCHEMA",
    help="Schema of the tables (default: search_path).",
)


@migrate.command("upgrade")
@click.argument("revision", default="heads")
@_url
@_schema
def migrate_upgrade(revision: str, url: str | None, schema: str | None) -> None:
    """Upgrade to REVISION (default: the newest)."""
    _migrate.upgrade(database_url(url), schema=schema, revision=revision)
    click.echo(f"upgraded to {revision}")


@migrate.command("downgrade")
@click.argument("revision")
@_url
@_schema
def migrate_downgrade(revision: str, url: str | None, schema: str | None) -> None:
    """Downgrade to REVISION ('base' removes every table)."""
    _migrate.downgrade(database_url(url), revision, schema=schema)
    click.echo(f"downgraded to {revision}")


@migrate.command("current")
@_url
@_schema
def migrate_current(url: str | None, schema: str | None) -> None:
    """Show the applied revision."""
    url = database_url(url)
    found = _migrate.current(url, schema=schema)
    if found:
        click.echo(found)
        return
    where = f"schema {schema}" if schema else "the search_path"
    elsewhere = [s for s in _migrate.schemas_with_tables(url) if s != schema]
    hint = (
        f": the tables are in {', '.join(elsewhere)}: pass --schema {elsewhere[0]} (or set "
        "OUTBOX_SCHEMA)"
        if elsewhere
        else ": run `outbox migrate upgrade` to create them"
    )
    click.echo(f"(none) in {where}{hint}")


@migrate.command("sql")
@click.argument("revision", default="heads")
@click.option("--from", "from_revision", default=None, help="Start revision (default: empty).")
@_schema
def migrate_sql(revision: str, from_revision: str | None, schema: str | None) -> None:
    """Print the upgrade DDL as SQL instead of running it (for DBAs)."""
    click.echo(_migrate.sql(revision, schema=schema, from_revision=from_revision))


@migrate.command("grants")
@click.option("--producer", "producers", multiple=True, help="Role of services that publish.")
@click.option("--relay", "relays", multiple=True, help="Role of the relay and its operators.")
@click.option("--consumer", "consumers", multiple=True, help="Role of inbox consumers.")
@click.option(
    "--console",
    "consoles",
    multiple=True,
    help="Role of `outbox console`: reads, and the audited requeue/purge/hold decisions.",
)
@click.option(
    "--reconcile",
    "reconcilers",
    multiple=True,
    help="Role of the Spark reconciliation: reads what it judges, records its runs.",
)
@click.option("--apply", "apply_to", is_flag=True, help="Run them (needs --url), not print.")
@_url
@_schema
def migrate_grants(
    producers: tuple[str, ...],
    relays: tuple[str, ...],
    consumers: tuple[str, ...],
    consoles: tuple[str, ...],
    reconcilers: tuple[str, ...],
    apply_to: bool,
    url: str | None,
    schema: str | None,
) -> None:
    """Print (or --apply) the least-privilege GRANTs for each role.

    See docs/how-to/least-privilege.md.
    """
    from outbox._grants import grant_statements

    wanted = {
        "producer": producers,
        "relay": relays,
        "consumer": consumers,
        "console": consoles,
        "reconcile": reconcilers,
    }
    statements = [
        stmt
        for kind, roles in wanted.items()
        for role in roles
        for stmt in grant_statements(kind, role, schema=schema)
    ]
    if not statements:
        raise click.UsageError(
            "name at least one role: --producer, --relay, --consumer, --console, --reconcile"
        )
    if not apply_to:
        click.echo(";\n".join(statements) + ";")
        return
    with _migrate._connected(database_url(url)) as conn:  # one transaction
        # on psycopg's connection itself, without parameters: the text is sent as it is (a
        # role name such as 'a%sb' is an identifier, never a placeholder)
        driver = conn.connection.driver_connection
        assert driver is not None
        for stmt in statements:
            driver.execute(stmt)
    click.echo(f"granted: {len(statements)} statement(s)")


@main.command("trace")
@click.argument("message_id", required=False)
@click.option(
    "--idempotency-key", default=None, help="Look it up by idempotency key (with --topic)."
)
@click.option("--topic", default=None, help="With --idempotency-key, or with --key and --seq.")
@click.option("--key", default=None, help="With --topic and --seq.")
@click.option("--seq", type=click.IntRange(min=1), default=None, help="With --topic and --key.")
@_url
@click.option(
    "--inbox",
    "inbox_urls",
    multiple=True,
    help="An inbox database to look in (repeatable), as `outbox reconcile` takes them.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The reconciliation's TOML job file: its [outbox] and [[inbox]] sources.",
)
@click.option(
    "--reports-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the reconciliation writes its runs: the last verdict on the message.",
)
@_schema
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def trace_cmd(
    message_id: str | None,
    idempotency_key: str | None,
    topic: str | None,
    key: str | None,
    seq: int | None,
    url: str | None,
    inbox_urls: tuple[str, ...],
    config_file: str | None,
    reports_dir: str | None,
    schema: str | None,
    as_json: bool,
) -> None:
    """Where is a message? Its outbox row, every inbox's record, the key's neighbours, the
    times between them and what to do when it is stuck. Read-only.

    Exit status 0 when it has arrived everywhere it was looked for (or is on its way), 1 when
    it is stuck or an inbox database cannot be read (the output says what to run), 2 when it
    is not found or the outbox database cannot be read."""
    from outbox.trace import (
        TraceSource,
        TraceSources,
        load_trace_sources,
        render_text,
        trace_message,
    )

    file_outbox, file_inboxes = load_trace_sources(config_file) if config_file else (None, ())
    if url or file_outbox is None:
        outbox = TraceSource("outbox", database_url(url), schema=schema)
    else:
        outbox = file_outbox if schema is None else TraceSource(
            file_outbox.name, file_outbox.url, file_outbox.user, file_outbox.password_env,
            file_outbox.password_file, schema,
        )  # fmt: skip
    inboxes = (
        tuple(
            TraceSource(f"inbox{i + 1}", _remember(u), schema=schema)
            for i, u in enumerate(inbox_urls)
        )
        if inbox_urls
        else file_inboxes
    )
    journey = trace_message(
        TraceSources(outbox, inboxes),
        message_id,
        idempotency_key=idempotency_key,
        topic=topic,
        key=key,
        seq=seq,
        reports_dir=reports_dir,
    )
    click.echo(journey.to_json() if as_json else render_text(journey))
    if journey.stuck:
        sys.exit(1)


def _remember(url: str) -> str:
    """``url``, its secrets remembered so that an error quoting it is masked."""
    remember_secrets(url)
    return url


def _load_plugins() -> None:
    """Add the subcommands other packages register under the ``outbox.cli`` entry point group
    (``relay``, ``status``, ``dead``, ``reconcile``...). ``outbox`` itself imports none of them."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="outbox.cli"):
        try:
            commands = ep.load()
        except MissingDependencyError as exc:
            main.add_command(_needs_extra(ep.name, exc.extra, exc.module))
            continue
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc)
            if extra is None:
                raise  # not an optional extra of ours: a real error, shown as it is
            main.add_command(_needs_extra(ep.name, extra, exc.name or ""))
            continue
        for command in commands:
            main.add_command(command)


def _needs_extra(name: str, extra: str, module: str) -> click.Command:
    """A stand-in for a subcommand whose optional dependencies are not installed."""

    @click.command(
        name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=f"(needs: pip install 'outbox-inbox[{extra}]')",
    )
    def stand_in() -> None:
        click.echo(
            f"error: `outbox {name}` needs the {extra!r} extra ({module} is not installed): "
            f"pip install 'outbox-inbox[{extra}]'",
            err=True,
        )
        sys.exit(2)

    return stand_in


_load_plugins()

if __name__ == "__main__":  # pragma: no cover
    main()
