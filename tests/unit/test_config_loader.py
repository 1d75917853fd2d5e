"""The one settings-file loader the relay and the reconciliation job share (outbox/_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox._config import (
    check_keys,
    check_value,
    env_secret,
    file_secret,
    parse_env,
    read_toml,
)
from outbox._redact import redact
from outbox.exceptions import ConfigurationError


def test_read_toml_names_the_file_for_a_missing_file_and_for_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"^cannot read job file .*nothing\.toml: "):
        read_toml(tmp_path / "nothing.toml", kind="job file")
    bad = tmp_path / "relay.toml"
    bad.write_text("database_url = [")
    with pytest.raises(ConfigurationError, match=r"^config file .*relay\.toml is not valid TOML"):
        read_toml(bad, kind="config file")
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigurationError, match=r"^cannot read config file"):
        read_toml(bad, kind="config file")


def test_an_unknown_key_is_named_with_where_it_is_the_closest_and_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as err:
        check_keys({"batch_sise": 1, "lease": 2, "url": 3}, ["batch_size", "url"], "f.toml")
    assert str(err.value) == (
        "f.toml: unknown key 'batch_sise' (did you mean 'batch_size'?) (and 'lease'); "
        "known: batch_size, url"
    )
    assert err.value.key == "batch_sise"  # type: ignore[attr-defined]
    check_keys({"url": 1}, ["batch_size", "url"], "f.toml")  # nothing unknown: no error


def test_a_value_error_says_what_is_accepted_and_masks_a_secret() -> None:
    with pytest.raises(ConfigurationError) as err:
        check_value("port", "abc", False, "a TCP port", where="f.toml", setting="port")
    assert str(err.value) == "f.toml: port must be a TCP port, got 'abc'"
    with pytest.raises(ConfigurationError) as err:
        check_value("broker_url", "nats://user:s3cret-pw@h", False, "a URL of another kind")
    assert "s3cret-pw" not in str(err.value)
    check_value("port", 5432, True, "a TCP port")


@pytest.mark.parametrize(
    ("raw", "kind", "value"),
    [
        ("yes", bool, True),
        ("0", bool, False),
        ("12", int, 12),
        ("0.5", float, 0.5),
        ("x", str, "x"),
    ],
)
def test_parse_env_reads_the_settings_type(raw: str, kind: type, value: object) -> None:
    assert parse_env("OUTBOX_X", raw, kind, "x") == value


@pytest.mark.parametrize(("raw", "kind"), [("maybe", bool), ("many", int), ("fast", float)])
def test_parse_env_refuses_text_of_another_type(raw: str, kind: type) -> None:
    expected = rf"OUTBOX_X='{raw}' is not a valid {kind.__name__} for x"
    with pytest.raises(ConfigurationError, match=expected):
        parse_env("OUTBOX_X", raw, kind, "x")


def test_secrets_read_from_the_environment_or_a_file_are_masked_afterwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADER_TEST_SECRET", "env-secret-4711")
    assert env_secret("LOADER_TEST_SECRET", "source 'a'") == "env-secret-4711"
    secret_file = tmp_path / "pw"
    secret_file.write_text("file-secret-0815\n")
    assert file_secret(str(secret_file), "source 'a'") == "file-secret-0815"
    shown = redact("driver said: env-secret-4711 / file-secret-0815")
    assert "env-secret-4711" not in shown
    assert "file-secret-0815" not in shown
    with pytest.raises(ConfigurationError, match="source 'a': environment variable NOPE_X"):
        env_secret("NOPE_X", "source 'a'")
    with pytest.raises(ConfigurationError, match="source 'a': cannot read password file"):
        file_secret(str(tmp_path / "missing"), "source 'a'")


def test_the_trace_reads_a_job_file_as_the_job_does_and_refuses_an_unknown_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.trace import load_trace_sources

    job = tmp_path / "job.toml"
    good = (
        '[outbox]\nurl = "jdbc:postgresql://db/app"\nuser = "recon"\n'
        'password_env = "RECON_PW"\nmax_connections = 4\n'
        '[[inbox]]\nname = "billing"\nurl = "postgresql://db/billing"\n'
        '[subscriptions]\norders = ["billing"]\n'
    )
    job.write_text(good)
    outbox, inboxes = load_trace_sources(job)
    assert outbox is not None
    assert (outbox.name, outbox.user, outbox.password_env) == ("outbox", "recon", "RECON_PW")
    assert [(s.name, s.url) for s in inboxes] == [("billing", "postgresql://db/billing")]
    monkeypatch.setenv("RECON_PW", "s3cret-pw")
    assert outbox.connect_kwargs()["password"] == "s3cret-pw"
    job.write_text(good.replace("user = ", "usr = "))
    with pytest.raises(
        ConfigurationError, match=r"\[outbox\]: unknown key 'usr' \(did you mean 'user'\?\)"
    ):
        load_trace_sources(job)
    job.write_text(good + "[threshold]\nlost = 0\n")
    with pytest.raises(
        ConfigurationError, match=r"unknown key 'threshold' \(did you mean 'thresholds'\?\)"
    ):
        load_trace_sources(job)
    job.write_text("[outbox\n")
    with pytest.raises(ConfigurationError, match="is not valid TOML"):
        load_trace_sources(job)
