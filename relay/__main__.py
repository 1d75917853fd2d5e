"""``python -m relay`` runs ``outbox relay``; ``python -m relay status`` and the rest too."""

from __future__ import annotations

import sys

import click

from outbox.kit import describe_cli_error
from relay.cli import commands, relay_cmd


def main() -> None:
    """Run the command; a library or database error is one line on stderr and exit status 2
    (as ``outbox``)."""
    try:
        if len(sys.argv) > 1 and sys.argv[1] in {c.name for c in commands}:
            group = click.Group("relay", commands={c.name or "": c for c in commands})
            group(prog_name="python -m relay")
        else:
            relay_cmd(prog_name="python -m relay")
    except Exception as exc:
        line = describe_cli_error(exc)  # the library's and the database's errors, masked
        if line is None:
            raise
        click.echo(f"error: {line}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
