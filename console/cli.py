"""``outbox console``: serve the console (see docs/console.md)."""

from __future__ import annotations

import click

__all__ = ["commands", "console_cmd"]


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
    help="Address to listen on; anything but 127.0.0.1 exposes it to the network.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8350, show_default=True)
@click.option(
    "--token",
    default=None,
    envvar="OUTBOX_CONSOLE_TOKEN",
    help="Operators log in with it to requeue or purge; without one the console is "
    "read-only. Prefer the environment variable to the flag.",
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
    sample_seconds: float,
) -> None:
    """Serve the operator console (the `console` extra)."""
    import uvicorn

    from console._app import create_app
    from outbox.cli import database_url

    if token is not None and len(token) < 16:
        raise click.BadParameter("use a token of at least 16 characters", param_hint="--token")
    app = create_app(database_url(url), token=token, schema=schema, sample_seconds=sample_seconds)
    mode = "changes need a login with the token" if token else "read-only (no token)"
    click.echo(f"outbox console on http://{host}:{port}/ ({mode})", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


commands = [console_cmd]
