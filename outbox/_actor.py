"""Who is acting, for the audit rows both sides write (outbox and inbox dead letters)."""

from __future__ import annotations

import getpass
import socket

__all__ = ["default_actor"]


def default_actor() -> str:
    """Who is acting, for the audit: user@host."""
    try:
        user = getpass.getuser()
    except Exception:  # pragma: no cover - no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
