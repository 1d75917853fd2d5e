"""The redactor is total: a password is masked whatever characters it holds, in a URL (raw or
percent-encoded, a URL nested in another's query), in a conninfo string, in settings; and a
configured secret is masked wherever it appears afterwards (pure logic; the end-to-end runs
are in tests/integration/test_no_secret_in_output.py)."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest

from outbox._redact import redact, remember_secrets, secrets_in

#: each character the issue names, and non-ASCII
HOSTILE_CHARS = ["'", '"', "<", ">", "`", " ", "%", "@", ":", "/", "#", "?", "&", "é", "密"]


def _password(c: str) -> str:
    """A fresh password holding ``c`` twice (fresh: an earlier test's remembered secret must
    not make this one pass)."""
    tag = uuid.uuid4().hex[:6]
    return f"Sntl{tag}{c}q7Zpw{c}x"


def _clean(out: str, password: str) -> None:
    tag = password[4:10]
    assert tag not in out, out  # no part of it, in any encoding
    assert "q7Zpw" not in out, out


def _conninfo_quoted(password: str) -> str:
    return "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.mark.parametrize("c", HOSTILE_CHARS)
def test_a_password_in_free_text_is_masked_whatever_it_holds(c: str) -> None:
    p = _password(c)
    nested = quote(f"http://AKIAX:{quote(p, safe='')}@h:4566", safe="")
    forms = [
        f"cannot connect to amqp://relay:{p}@127.0.0.1:5672/ (refused)",
        f"cannot connect to amqp://relay:{quote(p, safe='')}@127.0.0.1:5672/",
        f"error: 'postgresql://app:{p}@db:5432/x' is unreachable",
        f'url="nats://relay:{p}@h:4222" failed',
        f"<a href=redis://:{p}@h:6379/0>",
        f"host=db user=app password={_conninfo_quoted(p)} dbname=x",
        f"postgresql://app@db/x?password={quote(p, safe='')}&sslmode=require",
        f"sqs://us-east-1?endpoint=http://AKIAX:{quote(p, safe='')}@127.0.0.1:4566",
        f"sqs://us-east-1?endpoint={nested}",
        f"config {{'sasl.password': {p!r}, 'bootstrap.servers': 'k:9092'}}",
    ]
    if c not in " '\"":  # a conninfo value holds no raw blank or quote unless quoted
        forms.append(f"host=db password={p} dbname=x")
    for text in forms:
        _clean(redact(text), p)


@pytest.mark.parametrize("c", HOSTILE_CHARS)
def test_a_configured_secret_is_masked_wherever_it_appears(c: str) -> None:
    for source in (
        f"amqp://relay:{quote(p := _password(c), safe='')}@h:5672/",
        f"host=db password={_conninfo_quoted(q := _password(c))}",
        f"postgresql://app@db/x?sslpassword={quote(r := _password(c), safe='')}",
        f"sqs://us-east-1?endpoint=http://K:{quote(s := _password(c), safe='')}@h:4566",
    ):
        remember_secrets(source)
    remember_secrets({"sasl.password": (k := _password(c))})
    for secret in (p, q, r, s, k):
        assert secret in secrets_in_all(secret, c)
        # a driver's words, the raw value alone, percent-encoded
        for text in (
            f"FATAL: password authentication failed ({secret})",
            f"auth {quote(secret, safe='')} refused",
            f"auth {quote(secret)} refused",
        ):
            _clean(redact(text), secret)


def secrets_in_all(secret: str, c: str) -> set[str]:
    """What secrets_in finds in the forms a configuration writes ``secret`` in."""
    found: set[str] = set()
    for source in (
        f"amqp://relay:{quote(secret, safe='')}@h:5672/",
        f"host=db password={_conninfo_quoted(secret)}",
        f"sqs://r?endpoint=http://K:{quote(secret, safe='')}@h",
    ):
        found |= secrets_in(source)
    found |= secrets_in({"sasl.password": secret})
    return found


def test_what_is_not_a_secret_stays() -> None:
    for text in (
        "http://localhost:8080 failed; mail admin@example.com",
        "nats://127.0.0.1:4222 connection refused",
        "postgresql://app@db:5432/x?sslmode=require",
        "host=db port=5432 dbname=x",
    ):
        assert redact(text) == text
