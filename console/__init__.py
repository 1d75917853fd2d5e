"""``outbox console``: a small web application to see and fix what is stuck.

Backlog and publish rate per topic, relays, consumers, reconciliation runs; outbox dead letters
and inbox held keys to inspect, requeue or purge (with a reason, a dry run, and the same audited
paths as the CLI). Without a token it is read-only and listens on loopback only; with one,
every page needs a login (docs/how-to/console.md). Needs the ``console`` extra (Starlette,
Jinja2, uvicorn).
"""

from __future__ import annotations

from console._app import create_app

__all__ = ["create_app"]
