"""``outbox console``: a small web application to see and fix what is stuck.

Backlog and publish rate per topic, relays, consumers, reconciliation runs; outbox dead letters
and inbox held keys to inspect, requeue or purge (with a reason, a dry run, and the same audited
paths as the CLI). Without a token it is read-only and listens on loopback only; with one,
every page needs a login (docs/how-to/console.md). Needs the ``console`` extra (Starlette,
Jinja2, uvicorn).
"""

from __future__ import annotations

from outbox.kit import require

# the console's own objects need Starlette: say which extra brings it
for _module in ("starlette", "jinja2", "itsdangerous"):
    require(_module, "console")

from outbox_console._app import create_app  # noqa: E402

__all__ = ["create_app"]
