"""``outbox console``: serve the console (see docs/how-to/console.md)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import click

__all__ = ["commands", "console_cmd"]


def _wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


@click.command("console")
@click.option(
    "--url",
    default=None,
    help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, else $DATABASE_URL).",
)
@click.option("--schema", default=None, envvar="OUTBOX_SCHEMA", help="Schema of the tables.")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Anything but loopback needs a token.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8350, show_default=True)
@click.option(
    "--token",
    default=None,
    envvar="OUTBOX_CONSOLE_TOKEN",
    help="Operators log in with it (at least 16 characters) to see any page and to requeue or "
    "purge; without one the console is read-only and listens on loopback only. Prefer the "
    "environment variable to the flag.",
)
@click.option(
    "--allowed-host",
    "allowed_host",
    multiple=True,
    metavar="NAME",
    help="A Host header the console answers besides the --host address and localhost: the "
    "name operators reach it by (repeatable). Other Host headers get 400.",
)
@click.option(
    "--reports-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Serve reconciliation reports from this directory only (the reconciliation's "
    "output directory); without it, no report is served.",
)
@click.option(
    "--inbox",
    "inbox",
    multiple=True,
    metavar="NAME=URL",
    help="An inbox database the message page looks in (repeatable): NAME=postgresql://..., "
    "or a bare URL (named inbox1, inbox2... as `outbox trace --inbox` names them). Put the "
    "password in ~/.pgpass or PGPASSFILE rather than the URL; the page masks it.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The reconciliation's TOML job file: the message page looks in its [[inbox]] "
    "databases (as `outbox trace --config`); --inbox adds to them.",
)
@click.option(
    "--secure-cookie",
    is_flag=True,
    help="Mark the session cookie Secure: the console is reached through a TLS proxy.",
)
@click.option(
    "--trusted-proxy",
    "trusted_proxy",
    multiple=True,
    metavar="ADDRESS",
    help="Address or network of a proxy in front whose X-Forwarded-Proto and X-Forwarded-For "
    "are believed (repeatable): HTTPS through it marks the cookie Secure, and login limits "
    "count the client it names.",
)
@click.option(
    "--sample-seconds",
    type=click.FloatRange(min=1),
    default=10.0,
    show_default=True,
    help="How often the overview samples the backlog for its charts.",
)
def console_cmd(
    url: str | None,
    schema: str | None,
    host: str,
    port: int,
    token: str | None,
    allowed_host: tuple[str, ...],
    reports_dir: Path | None,
    inbox: tuple[str, ...],
    config_file: str | None,
    secure_cookie: bool,
    trusted_proxy: tuple[str, ...],
    sample_seconds: float,
) -> None:
    """Serve the operator console (the `console` extra)."""
    import uvicorn

    from outbox.cli import database_url
    from outbox.exceptions import ConfigurationError
    from outbox.trace import load_trace_sources
    from outbox_console._app import create_app

    if _wildcard(host) and not allowed_host:
        raise click.UsageError(
            f"--host {host} listens on every address: name the host name(s) operators reach "
            "the console by with --allowed-host (repeatable); other Host headers are refused"
        )
    try:
        _, from_file = load_trace_sources(config_file) if config_file else (None, ())
        app = create_app(
            database_url(url),
            token=token,
            schema=schema,
            sample_seconds=sample_seconds,
            host=host,
            allowed_host=allowed_host,
            reports_dir=reports_dir,
            secure_cookie=secure_cookie,
            trusted_proxy=trusted_proxy,
            inboxes=[*from_file, *inbox],
        )
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    mode = "every page needs a login with the token" if token else "read-only (no token)"
    click.echo(f"outbox console on http://{host}:{port}/ ({mode})", err=True)
    # The app reads proxy headers itself, and only from --trusted-proxy.
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )


commands = [console_cmd]
