"""Secrets out of text: the one redactor every output of the project goes through.

A secret reaches an output in one of a few shapes, and :func:`redact` masks each of them:

* a URL's user-info: ``postgresql://app:SECRET@db/x``, ``redis://:SECRET@h``, ``amqps://u:SECRET@h``,
  ``kafka://u:SECRET@h1,h2``; and, for NATS and Redis, a lone user-info (a token or a password:
  ``nats://SECRET@h``, ``redis://SECRET@h``): the user is kept where it is only a user name
  (PostgreSQL, AMQP, Kafka, MQTT);
* a secret query parameter of a URL (``?password=``, ``sslpassword``, ``token``, ...);
* a key=value setting in free text: a libpq conninfo string (``host=db password='a b'``), a
  Kafka setting (``sasl.password=...``), a quoted key in a ``dict`` or JSON (``'sasl.password':
  'x'``, ``"token": "x"``);
* a value known to be secret although it appears on its own: a driver that echoes the password
  it was given, in its own words. :func:`remember_secrets` records the secrets of the process's
  configuration (its database and broker URLs, its Kafka settings) once, at start-up, and every
  later :func:`redact` masks them wherever they appear, raw or percent-encoded.

:class:`RedactingFilter` applies :func:`redact` to every log record that reaches a handler; the
CLI, the relay and the console install it, so a third-party library's log line (psycopg's pool,
librdkafka's logger) is masked too.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from urllib.parse import quote, unquote

__all__ = [
    "MASK",
    "RedactingFilter",
    "install_log_redaction",
    "redact",
    "redact_library_logs",
    "remember_secrets",
    "secrets_in",
]

#: what a secret is replaced with
MASK = "***"

# A key whose value is secret: anything naming a password, a secret, a token or a seed (NATS
# nkeys), and the short forms. Matched case-insensitively, on the whole key.
_SECRET_KEY = r"[\w.\-]*(?:password|passwd|secret|token|seed)[\w.\-]*|pass|pwd|api[_\-]?key"  # noqa: S105
_SECRET_KEY_RE = re.compile(rf"(?:{_SECRET_KEY})", re.IGNORECASE)

# A URL in free text: a scheme, ``://`` and everything up to a blank, a quote, a bracket or the
# next URL of a comma-separated list (``nats://a,nats://b``). ``jdbc:postgresql://`` is one URL.
_URL_RE = re.compile(
    r"(?<![\w+.\-])((?:jdbc:)?[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"([^\s'\"<>`]+?)(?=[\s'\"<>`]|,[A-Za-z][A-Za-z0-9+.\-]*://|$)"
)

# key=value (conninfo, librdkafka settings, command lines) or a quoted key followed by ``:``
# (a dict's repr, JSON). The value: a quoted string (with backslash escapes) or a run of
# non-blank characters; one already masked is left alone.
_SETTING_RE = re.compile(
    rf"""(?P<key>(?<![\w.\-])(?:{_SECRET_KEY})(?![\w.\-])\s*=\s*
        |(?P<q>['"])(?:{_SECRET_KEY})(?P=q)\s*[:=]\s*)
        (?!{re.escape(MASK)})
        (?P<value>'(?:[^'\\]|\\.)*'(?![^\s),;\]}}])|"(?:[^"\\]|\\.)*"(?![^\s),;\]}}])
            |[^\s]*[^\s),;\]}}])""",
    re.IGNORECASE | re.VERBOSE,
)

#: schemes whose lone user-info (no ``:``) is a user name, not a token or a password
_USER_ONLY_SCHEMES = frozenset(
    ("postgresql", "postgres", "jdbc:postgresql", "amqp", "amqps", "kafka", "kafkas", "mqtt",
     "mqtts")
)  # fmt: skip

#: shorter known values are not masked on their own (they would mask common words)
_MIN_KNOWN = 4

_known: set[str] = set()
_known_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()


def redact(text: object, *, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret masked: URL user-info and secret query parameters, secret
    settings (conninfo, Kafka, dict and JSON forms), ``secrets`` and the values recorded with
    :func:`remember_secrets`. None and other objects are turned into text first."""
    out = str(text)
    known = _known_re(secrets)
    if known is not None:
        out = known.sub(MASK, out)
    if "://" in out:
        out = _redact_urls(out)
    if "=" in out or ":" in out:
        out = _SETTING_RE.sub(_mask_setting, out)
    return out


def secrets_in(source: str | Mapping[str, object] | None) -> set[str]:
    """The secret values inside ``source``: a URL (its password, a lone NATS/Redis user-info,
    its secret query parameters, each URL of a comma-separated list), a conninfo string, or a
    mapping of settings (values of secret keys, like Kafka's ``sasl.password``)."""
    found: set[str] = set()
    if not source:
        return found
    if isinstance(source, Mapping):
        for key, value in source.items():
            if value is not None and _SECRET_KEY_RE.fullmatch(str(key)):
                found.add(str(value))
        return found
    text = source.strip()
    whole = _SCHEME_RE.match(text)
    if whole is not None:
        # a configured URL (or a comma-separated list of them): all of it is the URL
        for url in _SPLIT_LIST_RE.split(text):
            found |= _url_secrets(url)
    elif "=" in text and "://" not in text:
        found |= _conninfo_secrets(text)
    else:
        for match in _URL_RE.finditer(text):
            found |= _url_secrets(match.group(0))
        for match in _SETTING_RE.finditer(text):
            found.add(_unquote_setting(match.group("value")))
    return {s for s in found if s}


def _url_secrets(url: str) -> set[str]:
    """The secrets of one whole URL: its password (raw as written and percent-decoded), a lone
    NATS/Redis user-info, its secret query parameters, and those of URLs nested in its query
    (``sqs://r?endpoint=http://KEY:SECRET@h``)."""
    found: set[str] = set()
    match = _SCHEME_RE.match(url)
    if match is None:
        return found
    scheme, rest = match.group(0), url[match.end() :]
    userinfo = _userinfo(rest)
    if userinfo:
        user, colon, password = userinfo.partition(":")
        secret = password if colon else (user if _lone_userinfo_is_secret(scheme) else "")
        found |= {secret, unquote(secret)}
    query = rest[len(userinfo) :].partition("?")[2]
    for item in query.split("&"):
        key, equals, value = item.partition("=")
        if not equals:
            continue
        if _SECRET_KEY_RE.fullmatch(unquote(key)):
            found |= {value, unquote(value)}
        elif "://" in unquote(value):
            found |= _url_secrets(unquote(value))
    return found


def _conninfo_secrets(conninfo: str) -> set[str]:
    """The secret values of a libpq conninfo string, read by libpq's own rules (psycopg's
    parser); the settings pattern when it does not parse."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(conninfo)
    except Exception:
        return {_unquote_setting(m.group("value")) for m in _SETTING_RE.finditer(conninfo)}
    return {str(v) for k, v in params.items() if v is not None and _SECRET_KEY_RE.fullmatch(k)}


def remember_secrets(*sources: str | Mapping[str, object] | None) -> None:
    """Record the secrets in ``sources`` (see :func:`secrets_in`): every later :func:`redact`
    masks them wherever they appear, raw or percent-encoded (a driver's error that quotes the
    password it was given)."""
    global _known_pattern
    new: set[str] = set()
    for source in sources:
        new |= secrets_in(source)
    for secret in list(new):
        new.add(quote(secret, safe=""))
        new.add(quote(secret))
        new.add(unquote(secret))
    new = {s for s in new if len(s) >= _MIN_KNOWN}
    with _lock:
        if new <= _known:
            return
        _known.update(new)
        _known_pattern = _alternation(_known)


def _known_re(extra: Iterable[str]) -> re.Pattern[str] | None:
    extra = [s for s in extra if s and len(s) >= _MIN_KNOWN]
    if not extra:
        return _known_pattern
    return _alternation(_known.union(extra))


def _alternation(values: Iterable[str]) -> re.Pattern[str]:
    # longest first: a secret that contains another is masked whole
    return re.compile("|".join(re.escape(v) for v in sorted(values, key=len, reverse=True)))


def _userinfo(rest: str) -> str:
    """The user-info of a URL's part after ``://`` ('' when none). It ends at the last ``@``
    (unless that one is in a query value), so a password with a raw ``@``, ``/`` or ``?`` is
    still all of it."""
    at = rest.rfind("@")
    query = rest.find("?")
    if 0 <= query < at and "=" in rest[query:at]:  # that '@' is in a query value
        at = rest.rfind("@", 0, query)
    return rest[:at] if at >= 0 else ""


def _lone_userinfo_is_secret(scheme: str) -> bool:
    return scheme.removesuffix("://").lower() not in _USER_ONLY_SCHEMES


#: where a URL in free text starts; and a comma-separated list's next URL
_SCHEME_RE = re.compile(r"(?<![\w+.\-])(?:jdbc:)?[A-Za-z][A-Za-z0-9+.\-]*://")
_SPLIT_LIST_RE = re.compile(r",(?=(?:jdbc:)?[A-Za-z][A-Za-z0-9+.\-]*://)")
#: what ends a URL's host, path and query in free text (a password may hold any of them)
_URL_END = re.compile(r"[\s'\"<>`]|,(?=(?:jdbc:)?[A-Za-z][A-Za-z0-9+.\-]*://)")
#: an ``@`` that ends a user-info: a host follows it
_AT_HOST = re.compile(r"@(?=[\w\[])")


def _redact_urls(text: str) -> str:
    """Every URL of ``text`` with its user-info's secret and its secret query parameters
    masked, and the URLs nested in its query too. A password may hold any character: the
    user-info runs to the last ``@`` before the host, past quotes, brackets and backticks; a
    ``user:`` followed by a blank before any ``@`` (a password with a space, written raw)
    runs to the next ``@`` before a host on the same line."""
    out: list[str] = []
    pos = 0
    while (match := _SCHEME_RE.search(text, pos)) is not None:
        start = match.end()
        out.append(text[pos:start])
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        nxt = _SCHEME_RE.search(text, start, line_end)
        limit = nxt.start() if nxt is not None else line_end
        token = re.match(r"\S*", text[start:limit])
        token_end = start + (token.end() if token else 0)
        listed = _SPLIT_LIST_RE.search(text, start, token_end)
        if listed is not None:
            token_end = listed.start()
        userinfo = _userinfo(text[start:token_end])
        if not userinfo:
            userinfo = _spaced_userinfo(text[start:limit])
        head = _masked_userinfo(match.group(0), userinfo)
        end_match = _URL_END.search(text, start + len(userinfo))
        end = min(end_match.start() if end_match else len(text), max(limit, token_end))
        end = max(end, start + len(userinfo))
        out.append(head + _masked_query(text[start + len(userinfo) : end]))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _spaced_userinfo(rest: str) -> str:
    """``user:pass word`` before an ``@`` and a host on the same line ('' when ``rest`` does
    not start like a user-info, or its ``:`` is a port's)."""
    first = re.match(r"[^\s/?#@:]*:([^\s/?#@]*)", rest)
    if first is None or not first.group(1) or first.group(1).isdigit():
        return ""
    ats = [m.start() for m in _AT_HOST.finditer(rest)]
    return rest[: ats[-1]] if ats else ""


def _masked_userinfo(scheme: str, userinfo: str) -> str:
    if not userinfo:
        return ""
    user, colon, _ = userinfo.partition(":")
    if colon:
        return f"{user}:{MASK}"
    return MASK if _lone_userinfo_is_secret(scheme) else user


def _masked_query(rest: str) -> str:
    """``rest`` (an ``@``-prefixed host, a path, a query) with its secret parameters masked and
    the URLs in its parameter values redacted (raw or percent-encoded)."""
    head, question, query = rest.partition("?")
    if not question:
        return rest
    query, hash_, fragment = query.partition("#")
    parts = []
    for item in query.split("&"):
        key, equals, value = item.partition("=")
        if equals and _SECRET_KEY_RE.fullmatch(unquote(key)):
            item = f"{key}={MASK}"
        elif equals and "://" in value:
            item = f"{key}={_redact_urls(value)}"
        elif equals and "://" in unquote(value):
            nested = unquote(value)
            masked = _redact_urls(nested)
            if masked != nested:
                item = f"{key}={quote(masked, safe='*')}"
        parts.append(item)
    return f"{head}?{'&'.join(parts)}{hash_}{fragment}"


def _mask_setting(match: re.Match[str]) -> str:
    value = match.group("value")
    quote_char = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group('key')}{quote_char}{MASK}{quote_char}"


def _unquote_setting(value: str) -> str:
    if value[:1] in ("'", '"') and len(value) >= 2:
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


class RedactingFilter(logging.Filter):
    """Masks secrets in every record it sees: its message, its arguments, its exception text
    and the extra fields a JSON formatter writes. Installed on handlers, so records of every
    logger (psycopg's pool, a broker client) pass through it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: masked as it is, without its arguments
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            # formatted once, here, so the traceback's text is masked too
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        for name, value in list(vars(record).items()):
            if isinstance(value, str) and name not in _RECORD_FIELDS and value:
                setattr(record, name, redact(value))
        return True


_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def install_log_redaction(handler: logging.Handler | None = None) -> None:
    """Add a :class:`RedactingFilter` to ``handler`` (default: every handler of the root
    logger), once."""
    handlers = [handler] if handler is not None else logging.getLogger().handlers
    for h in handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())


#: the project's own loggers (a filter on a logger sees only the records logged to it by name)
LIBRARY_LOGGERS: tuple[str, ...]
LIBRARY_LOGGERS = (
    "outbox.cli", "outbox.console", "outbox.fastapi", "outbox.wakeup", "inbox.consumer",
    "inbox.runner", "relay", "relay.brokers.kafka", "relay.brokers.mqtt", "relay.brokers.nats",
    "relay.brokers.rabbitmq",
)  # fmt: skip
LIBRARY_LOGGERS += ("relay.brokers.amqp1", "outbox.amqp1", "proton")  # AMQP 1.0, and its client
LIBRARY_LOGGERS += ("relay.brokers.kafka.client",)  # librdkafka's own lines


def redact_library_logs() -> None:
    """Add a :class:`RedactingFilter` to the project's own loggers, once: their records are
    masked whatever handlers the application configured (the relay in a FastAPI lifespan)."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
