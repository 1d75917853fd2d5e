"""The one redactor (outbox._redact), the listings' escaping (outbox._errors.one_line) and the
Kafka URL's SASL settings: pure logic, so no services."""

from __future__ import annotations

import logging
import uuid

import pytest

from outbox import _redact
from outbox._errors import connect_failure, describe_cli_error, one_line
from outbox._redact import MASK, RedactingFilter, redact, remember_secrets, secrets_in
from outbox.exceptions import ConfigurationError


@pytest.fixture(autouse=True)
def nothing_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no remembered secrets: other tests of the process (a relay, a
    broker URL with guest:guest) record theirs, and "guest" would then be masked here."""
    monkeypatch.setattr(_redact, "_known", set())
    monkeypatch.setattr(_redact, "_known_pattern", None)

S = "Sentinel-" + uuid.uuid4().hex[:8]

FORMS = [
    f"postgresql://app:{S}@db.example:5432/orders",
    f"postgres://app:{S}@db/orders?sslmode=require",
    f"jdbc:postgresql://app:{S}@db:5432/orders",
    f"postgresql://app@db/orders?password={S}&sslmode=require",
    f"postgresql://app@db/orders?sslmode=verify-full&sslpassword={S}",
    f"host=db port=5432 dbname=orders user=app password={S}",
    f"host=db password='{S} with spaces' dbname=orders",
    f"host=db password = '{S}\\'quoted' dbname=orders",
    f"host=db sslpassword={S}",
    f"nats://{S}@127.0.0.1:4222",
    f"nats://user:{S}@a:4222,nats://user:{S}@b:4222",
    f"nats://127.0.0.1:4222?token={S}",
    f"amqp://guest:{S}@127.0.0.1:5672/",
    f"amqps://guest:{S}@broker/vhost",
    f"kafka://relay:{S}@k1:9092,k2:9092?mechanism=SCRAM-SHA-512",
    f"kafkas://relay:{S}@k1:9093",
    f"redis://:{S}@127.0.0.1:6379/0",
    f"rediss://default:{S}@cache:6380/1",
    f"redis://{S}@127.0.0.1:6379/0",
    f"mqtt://device:{S}@127.0.0.1:1883",
    f"mqtts://device:{S}@broker:8883",
    f"sasl.password={S}",
    f"{{'sasl.password': '{S}', 'bootstrap.servers': 'k1:9092'}}",
    f'{{"sasl.password": "{S}"}}',
    f"ssl.key.password={S} sasl.username=relay",
]


@pytest.mark.parametrize("text", FORMS)
def test_every_form_is_masked(text: str) -> None:
    for shown in (text, f"error: cannot connect to {text}: refused", repr(text)):
        out = redact(shown)
        assert S not in out, out
        assert MASK in out


@pytest.mark.parametrize("text", FORMS)
def test_the_secret_of_every_form_is_found(text: str) -> None:
    found = secrets_in(text)
    assert any(S in s for s in found), found


def test_what_is_not_secret_stays() -> None:
    kept = [
        "postgresql://app@db:5432/orders?sslmode=require",
        "host=db dbname=orders user=app",
        "kafka://k1:9092,k2:9092",
        "amqp://guest@broker/",
        "the password is wrong: check --url",
        "topic=orders key=order-7",
    ]
    for text in kept:
        assert redact(text) == text
    assert redact("postgresql://app:pw@db/x") == f"postgresql://app:{MASK}@db/x"
    assert redact("host=db password=x port=5") == f"host=db password={MASK} port=5"
    # a password with a raw '@', '/' or '?' is masked whole; a query value's '@' is not user-info
    assert redact("postgresql://u:p@s/s?w@db/x") == f"postgresql://u:{MASK}@db/x"
    assert redact("postgresql://u:pw@db/x?application_name=a@b") == (
        f"postgresql://u:{MASK}@db/x?application_name=a@b"
    )


def test_known_secrets_are_masked_anywhere() -> None:
    secret = "Known" + uuid.uuid4().hex[:10] + "/@x"
    remember_secrets(f"redis://:{secret}@h:6379/0".replace("/@x", "%2F%40x"))
    assert secret not in redact(f"AUTH {secret} refused")
    assert "%2F%40x" not in redact(f"AUTH {secret.replace('/@x', '%2F%40x')} refused")
    other = "Mapped" + uuid.uuid4().hex[:10]
    remember_secrets({"sasl.password": other, "bootstrap.servers": "k1:9092"})
    assert other not in redact(f"SASL authentication error for {other}")
    assert "k1:9092" in redact("k1:9092")
    one_off = "OneOff" + uuid.uuid4().hex[:10]
    assert redact(f"x {one_off} y", secrets=[one_off]) == f"x {MASK} y"


def test_the_log_filter_masks_messages_arguments_tracebacks_and_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test_redact")
    caplog.handler.addFilter(RedactingFilter())
    try:
        logger.warning("cannot connect to %s", f"redis://:{S}@h:1/0", extra={"url": f"redis://:{S}@h"})
        try:
            raise ValueError(f"conninfo host=h password={S}")
        except ValueError:
            logger.exception("failed")
    finally:
        caplog.handler.filters.clear()
    assert S not in caplog.text
    [first, second] = caplog.records
    assert S not in first.getMessage()
    assert S not in str(vars(first))
    assert second.exc_text is not None
    assert "ValueError" in second.exc_text
    assert S not in second.exc_text


def test_cli_errors_are_masked() -> None:
    line = describe_cli_error(ConfigurationError(f"bad postgresql://u:{S}@h/x"))
    assert line is not None
    assert S not in line
    assert describe_cli_error(RuntimeError("a bug")) is None


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('connection failed: ... FATAL:  database "x" does not exist', "database"),
        ('connection failed: ... FATAL:  role "x" does not exist', "login"),
        ('connection failed: FATAL:  password authentication failed for user "x"', "login"),
        ('connection is bad: invalid port number: "99999"', "url"),
        ("connection failed: ... port 1 failed: Connection refused", None),
        ("connection failed: ... FATAL:  the database system is shutting down", None),
        ("connection failed: ... FATAL:  the database system is starting up", None),
        ("connection failed: ... FATAL:  sorry, too many clients already", None),
        ("connection timeout expired", None),
        ("failed to resolve host 'db': Name or service not known", None),
    ],
)
def test_which_connect_failures_can_heal(text: str, kind: str | None) -> None:
    import psycopg

    assert connect_failure(psycopg.OperationalError(text)) == kind


def test_listings_escape_every_control_character() -> None:
    hostile = "k\x1b[2J\x1b]0;owned\x07\r\n\t\\\x9b\x7f\u202e\u2028end é"
    shown = one_line(hostile)
    assert shown.isprintable()
    assert "\x1b" not in shown
    assert "\x9b" not in shown
    assert "\u202e" not in shown
    assert shown == "k\\x1b[2J\\x1b]0;owned\\x07\\r\\n\\t\\\\\\x9b\\x7f\\u202e\\u2028end é"
    assert one_line("plain key-1") == "plain key-1"


def test_kafka_user_info_becomes_sasl_settings() -> None:
    pytest.importorskip("confluent_kafka")
    from relay.brokers import publisher_for_url

    pub = publisher_for_url(f"kafka://relay:{S}@k1:9092,k2:9092?mechanism=scram-sha-512")
    config = pub._config  # type: ignore[attr-defined]
    assert config["bootstrap.servers"] == "k1:9092,k2:9092"
    assert (config["sasl.username"], config["sasl.password"]) == ("relay", S)
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert config["security.protocol"] == "SASL_PLAINTEXT"
    assert "@" not in pub._bootstrap
    assert S not in pub._bootstrap
    assert S not in redact(str(config))

    tls = publisher_for_url("kafkas://relay:p%40ss@k1:9093")._config  # type: ignore[attr-defined]
    assert tls["security.protocol"] == "SASL_SSL"
    assert tls["sasl.mechanism"] == "PLAIN"
    assert tls["sasl.password"] == "p@ss"
    assert publisher_for_url("kafkas://k1:9093")._config["security.protocol"] == "SSL"  # type: ignore[attr-defined]
    plain = publisher_for_url("kafka://k1:9092")._config  # type: ignore[attr-defined]
    assert "security.protocol" not in plain
    assert "sasl.password" not in plain
    # the caller's own settings win over the URL's
    ours = publisher_for_url(
        f"kafka://relay:{S}@k1:9092", config={"sasl.mechanism": "SCRAM-SHA-256"}
    )._config  # type: ignore[attr-defined]
    assert ours["sasl.mechanism"] == "SCRAM-SHA-256"
    assert ours["sasl.password"] == S


@pytest.mark.parametrize(
    "url",
    [
        f"kafka://{S}@k1:9092",  # a lone user-info: SASL needs user:password
        f"kafka://relay:{S}@k1:9092?mechanism=GSSAPI",
        f"kafka://relay:{S}@k1:9092?sasl.password={S}",
        f"kafka://relay:{S}@",
    ],
)
def test_a_bad_kafka_url_is_refused_without_its_secret(url: str) -> None:
    pytest.importorskip("confluent_kafka")
    from relay.brokers import publisher_for_url

    with pytest.raises(ConfigurationError) as caught:
        publisher_for_url(url)
    assert S not in str(caught.value)
    assert S not in str(vars(caught.value))
