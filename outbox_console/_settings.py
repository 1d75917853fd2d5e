"""What a console is started with, checked once: the token, the address, the reports."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from outbox.exceptions import ConfigurationError
from outbox.kit import remember_secrets
from outbox.trace import TraceSource
from outbox_console._security import allowed_hosts, check_listen, check_token

__all__ = ["Settings", "inbox_source", "settings"]

#: ``NAME=URL``: a name, then a PostgreSQL URL (a bare URL, or key=value connection string,
#: is not split)
_NAMED = re.compile(r"^([A-Za-z0-9_.-]{1,64})=((?:jdbc:)?postgres(?:ql)?://.*)$", re.DOTALL)


@dataclass(frozen=True)
class Settings:
    """A console's settings (``create_app``'s arguments, checked)."""

    url: str
    token: str | None
    schema: str | None
    sample_seconds: float
    #: the Host header values the console answers
    hosts: list[str]
    #: the directory reconciliation reports are served from (None: none is served)
    reports: Path | None
    secure_cookie: bool
    #: addresses or networks of proxies whose forwarded headers are believed
    proxies: list[str]
    pool_size: int
    #: the inbox databases the message page looks in
    inboxes: tuple[TraceSource, ...] = ()

    @property
    def writable(self) -> bool:
        """With a token, a logged-in operator may requeue and purge."""
        return self.token is not None


def settings(
    url: str,
    *,
    token: str | None,
    schema: str | None,
    sample_seconds: float,
    host: str,
    allowed_host: Iterable[str],
    reports_dir: str | Path | None,
    secure_cookie: bool,
    trusted_proxy: Iterable[str],
    pool_size: int,
    inboxes: Iterable[str | TraceSource] = (),
) -> Settings:
    """The settings, or ConfigurationError for a token, host or directory that will not do."""
    check_token(token)
    check_listen(host, token)
    return Settings(
        url=url,
        token=token,
        schema=schema,
        sample_seconds=sample_seconds,
        hosts=allowed_hosts(host, allowed_host),
        reports=_reports_root(reports_dir),
        secure_cookie=secure_cookie,
        proxies=[p.strip() for p in trusted_proxy if p.strip()],
        pool_size=max(1, pool_size),
        inboxes=_inboxes(inboxes, schema),
    )


def inbox_source(text: str, number: int, schema: str | None) -> TraceSource:
    """``NAME=URL`` or a bare ``URL`` (named ``inbox<number>``, as ``outbox trace --inbox``
    names them) as an inbox database to look in."""
    named = _NAMED.match(text.strip())
    name, url = (named.group(1), named.group(2)) if named else (f"inbox{number}", text.strip())
    if not url:
        raise ConfigurationError("an inbox is NAME=postgresql://... or a URL", setting="inboxes")
    remember_secrets(url)
    return TraceSource(name, url, schema=schema)


def _inboxes(given: Iterable[str | TraceSource], schema: str | None) -> tuple[TraceSource, ...]:
    out = tuple(
        g if isinstance(g, TraceSource) else inbox_source(g, i + 1, schema)
        for i, g in enumerate(given)
    )
    names = [s.name for s in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(
            f"two inboxes are named {', '.join(twice)}: give each its own NAME=URL",
            setting="inboxes",
        )
    return out


def _reports_root(reports_dir: str | Path | None) -> Path | None:
    if reports_dir is None:
        return None
    root = Path(reports_dir).resolve()
    if not root.is_dir():
        raise ConfigurationError(
            f"the reports directory {str(reports_dir)!r} is not a directory: pass the directory "
            "the reconciliation writes its runs into (--output-dir of `outbox reconcile`)",
            setting="reports_dir",
        )
    return root
