"""One rule for a database URL, whatever command or process takes it.

Accepted everywhere (every ``outbox`` command, the relay, the Spark jobs):

* ``postgresql://user@host:5432/dbname`` and ``postgres://...`` (libpq's URL);
* ``postgresql+<driver>://...`` (SQLAlchemy's, e.g. ``postgresql+psycopg://``): the driver part
  is dropped, the rest is libpq's URL;
* ``jdbc:postgresql://host:5432/dbname`` (JDBC's): the ``jdbc:`` prefix is dropped;
* libpq's ``key=value`` string (``host=db dbname=app user=app``).

:func:`libpq_url` turns any of them into what psycopg takes, and says in its error where the
URL came from (``--url``, ``$OUTBOX_DATABASE_URL``, ``$DATABASE_URL``, a config file), which
:func:`url_source` also gives to the hints of later connection errors.
"""

from __future__ import annotations

import re

from outbox._redact import redact
from outbox.exceptions import ConfigurationError

__all__ = ["ACCEPTED", "libpq_url", "url_source"]

#: the forms, for errors and help texts
ACCEPTED = (
    "postgresql://user@host:5432/dbname (also postgres://, postgresql+psycopg://, "
    "jdbc:postgresql://) or a libpq string 'host=... dbname=...'"
)
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_source = "--url (or $OUTBOX_DATABASE_URL)"


def url_source(source: str | None = None) -> str:
    """Where the URL in use came from (what hints tell the operator to check); ``source``
    records it."""
    global _source
    if source:
        _source = source
    return _source


def libpq_url(url: str, source: str) -> str:
    """``url`` as libpq takes it; a ConfigurationError naming ``source`` when it is none of the
    accepted forms."""
    text = url.strip()
    if text.lower().startswith("jdbc:"):
        text = text[5:]
    match = _SCHEME.match(text)
    if match is None:
        if "=" in text:  # libpq key=value
            return text
        raise ConfigurationError(
            f"{source}: {redact(url)!r} is not a PostgreSQL URL: use {ACCEPTED}", source=source
        )
    scheme = match.group("scheme").lower()
    base, _, driver = scheme.partition("+")
    if base not in ("postgresql", "postgres") or (driver and not driver.isidentifier()):
        raise ConfigurationError(
            f"{source}: {redact(url)!r} is not a PostgreSQL URL (scheme {scheme!r}): use "
            f"{ACCEPTED}",
            source=source,
        )
    return "postgresql://" + text[match.end() :]
