"""The reconciliation's configuration: TOML job files, flags, and their validation.

Pure Python: no Spark session and no database (the CLI fails on the configuration before it
starts Spark).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox.cli import main
from outbox.exceptions import ConfigurationError
from spark_ingest import JobConfig, Source, Window, load_toml
from spark_ingest._config import parse_duration
from spark_ingest.cli import _job_config

URL = "jdbc:postgresql://127.0.0.1:5432/app"
GOOD = f"""
sla = "2h"
[outbox]
url = "{URL}"
user = "recon"
password_file = "/run/secrets/recon"
[[inbox]]
name = "billing"
url = "jdbc:postgresql://127.0.0.1:5432/billing"
password_env = "RECON_PW"
[[inbox]]
name = "shipping"
url = "jdbc:postgresql://127.0.0.1:5432/shipping"
[subscriptions]
orders = ["billing", "shipping"]
[thresholds]
duplicate = 10
"""
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _job_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_load_toml_reads_the_documented_job_file(tmp_path: Path) -> None:
    got = load_toml(_job_file(tmp_path, GOOD))
    assert got["outbox"].login == "recon"
    assert [s.name for s in got["inboxes"]] == ["billing", "shipping"]
    assert got["subscriptions"] == {"orders": ("billing", "shipping")}
    assert got["sla"] == dt.timedelta(hours=2)
    assert got["thresholds"] == {"duplicate": 10}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # [inbox] for [[inbox]]: a table, not an array of tables
        (f'[inbox]\nurl = "{URL}"', r"'inbox' must be an array of tables: write \[\[inbox\]\]"),
        ('inbox = ["jdbc:postgresql://h/db"]', r"array of tables"),
        (f'outbox = "{URL}"', r"\[outbox\] must be a table"),
        ("[[inbox]]\nname = 'x'", r"\[\[inbox\]\] #1 has no 'url'"),
        (f"[outbox]\nurl = '{URL}'\nuser = 7", r"\[outbox\]: user must be a non-empty string"),
        ('[thresholds]\nduplicate = "ten"', r"duplicate = 'ten': a threshold must be a whole"),
        ("[thresholds]\nduplicate = 1.9", r"duplicate = 1\.9: a threshold must be a whole"),
        ("[thresholds]\nduplicate = true", r"duplicate = True: a threshold must be a whole"),
        ("[thresholds]\nlost = -1", r"lost = -1: a threshold must be a whole number >= 0"),
        ("[thresholds]\nlots = 1", r"unknown threshold class 'lots' \(did you mean 'lost'\?\)"),
        ("thresholds = 3", r"'thresholds' must be a table"),
        ('sla = "1e30d"', r"sla: invalid duration '1e30d': too long"),
        ('sla = "-1h"', r"sla: invalid duration '-1h': not positive"),
        ('sla = "0s"', r"not positive"),
        ('sla = "nan"', r"too long|not a duration"),
        ('sla = "ten minutes"', r"sla: invalid duration 'ten minutes': not a duration"),
        ("sla = true", r'sla must be a duration like "1h"'),
        ('[subscriptions]\norders = "billing"', r"orders: expected a list of consumer names"),
        ("[subscriptions]\norders = []", r"orders: expected a non-empty list"),
        ("[subscriptions]\norders = [1]", r"orders: expected a non-empty list"),
        ('subscriptions = ["orders"]', r"'subscriptions' must be a table"),
        # misspelled keys, at every level: named, with the known ones listed
        ('slaa = "1h"', r"unknown key 'slaa' \(did you mean 'sla'\?\); known: outbox, inbox"),
        (
            f'[outbox]\nurl = "{URL}"\npasword_env = "PW"',
            r"\[outbox\]: unknown key 'pasword_env' \(did you mean 'password_env'\?\); "
            r"known: name, url, user, password_env, password_file, schema",
        ),
        (f'[[inbox]]\nurl = "{URL}"\nschem = "s"', r"\[\[inbox\]\] #1: unknown key 'schem'"),
        ("[outbox]\nurl = 'jdbc:postgresql://127.0.0.1:99999/x'", r"Port out of range"),
        ("[outbox]\nurl = 'jdbc:postgresql://127.0.0.1:0/x'", r"port from 1 to 65535"),
        ("[outbox]\nurl = 'jdbc:postgresql://[::1/x'", r"invalid URL"),
        ("sla = ", r"job file .* is not valid TOML"),
    ],
)
def test_load_toml_rejects_a_bad_job_file_naming_the_key(
    tmp_path: Path, text: str, error: str
) -> None:
    with pytest.raises(ConfigurationError, match=error) as err:
        load_toml(_job_file(tmp_path, text))
    assert "job file" in str(err.value) or "source 'outbox'" in str(err.value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("90s", None),
        ("15m", None),
        ("1.5h", None),
        ("3600", None),
        ("-1h", "not positive"),
        ("0", "not positive"),
        ("1e30d", "too long"),
        ("inf", "too long"),
        ("", "not a duration"),
        ("h", "not a duration"),
    ],
)
def test_parse_duration_accepts_only_positive_finite_durations(
    text: str, error: str | None
) -> None:
    if error is None:
        assert parse_duration(text) > dt.timedelta(0)
    else:
        with pytest.raises(ConfigurationError, match=error):
            parse_duration(text, what="--sla")


def _config(**overrides: Any) -> JobConfig:
    kw: dict[str, Any] = {
        "outbox": Source("outbox", URL),
        "inboxes": (Source("billing", "jdbc:postgresql://h/billing"),),
        "subscriptions": {"orders": ("billing",)},
        "window": Window(T0, T0 + dt.timedelta(days=1)),
    }
    return JobConfig(**(kw | overrides))


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"subscriptions": {"orders": "billing"}}, "expected a list of consumer names"),
        ({"thresholds": {"duplicate": 1.9}}, "a threshold must be a whole number"),
        ({"thresholds": {"duplicate": True}}, "a threshold must be a whole number"),
        ({"sla": dt.timedelta(hours=-1)}, "the SLA must be positive"),
        (
            {
                "inboxes": (
                    Source("billing", "jdbc:postgresql://h/billing"),
                    Source("billing", "jdbc:postgresql://h/shipping"),
                )
            },
            "two inbox sources are named 'billing'",
        ),
        (
            {
                "inboxes": (
                    Source("billing", "jdbc:postgresql://H:5432/billing"),
                    Source("shipping", "postgresql://h/billing"),
                )
            },
            r"'billing' and 'shipping' both read h:5432/billing .*counted twice",
        ),
    ],
)
def test_job_config_rejects_what_would_miscount(overrides: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        _config(**overrides)


def test_job_config_accepts_one_database_with_two_inbox_schemas() -> None:
    inboxes = (
        Source("billing", "jdbc:postgresql://h/app", schema="billing"),
        Source("shipping", "jdbc:postgresql://h/app", schema="shipping"),
    )
    assert _config(inboxes=inboxes).inboxes == inboxes


def test_load_toml_rejects_one_inbox_database_listed_twice(tmp_path: Path) -> None:
    text = (
        '[[inbox]]\nname = "a"\nurl = "jdbc:postgresql://127.0.0.1/billing"\n'
        '[[inbox]]\nname = "b"\nurl = "postgresql://127.0.0.1:5432/billing"\n'
    )
    with pytest.raises(ConfigurationError, match="'a' and 'b' both read"):
        load_toml(_job_file(tmp_path, text))


# --- the CLI: flags, the job file, and exit status 2 with one line ----------------------------


def _opts(**overrides: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "config_file": None,
        "outbox_url": None,
        "inbox_urls": (),
        "user": None,
        "password_env": None,
        "password_file": None,
        "schema": None,
        "subscribe": (),
        "since": T0.isoformat(),
        "until": (T0 + dt.timedelta(days=1)).isoformat(),
        "sla": None,
        "fail_above": (),
    }
    return opts | overrides


def test_cli_config_file_alone_gives_the_job(tmp_path: Path) -> None:
    config = _job_config(_opts(config_file=str(_job_file(tmp_path, GOOD))))
    assert config.outbox.jdbc_url == URL
    assert [s.name for s in config.inboxes] == ["billing", "shipping"]
    assert config.subscriptions == {"orders": ("billing", "shipping")}
    assert config.sla == dt.timedelta(hours=2)
    assert config.thresholds == {"duplicate": 10}


def test_cli_flags_win_over_the_config_file(tmp_path: Path) -> None:
    config = _job_config(
        _opts(
            config_file=str(_job_file(tmp_path, GOOD)),
            outbox_url="jdbc:postgresql://127.0.0.1:5432/other",
            subscribe=("audit=billing",),
            sla="30m",
            fail_above=("duplicate=3", "lost=1"),
            user="flag-user",
            password_env="FLAG_PW",
        )
    )
    assert config.outbox.jdbc_url == "jdbc:postgresql://127.0.0.1:5432/other"
    assert config.subscriptions == {"audit": ("billing",)}
    assert config.sla == dt.timedelta(minutes=30)
    assert config.thresholds == {"duplicate": 3, "lost": 1}
    # the file's inboxes are kept, with the connection flags applied to every source
    assert [s.name for s in config.inboxes] == ["billing", "shipping"]
    for src in (config.outbox, *config.inboxes):
        assert (src.login, src.password_env, src.password_file) == ("flag-user", "FLAG_PW", None)
    inboxes = _job_config(
        _opts(config_file=str(_job_file(tmp_path, GOOD)), inbox_urls=("postgresql://h/x",))
    ).inboxes
    assert [s.jdbc_url for s in inboxes] == ["jdbc:postgresql://h:5432/x"]


def test_cli_subscribe_repeated_for_a_topic_merges_the_consumers() -> None:
    config = _job_config(
        _opts(
            outbox_url=URL,
            inbox_urls=("postgresql://h/b",),
            subscribe=("orders=billing", "orders=shipping,billing", "audit=billing"),
        )
    )
    assert config.subscriptions == {"orders": ("billing", "shipping"), "audit": ("billing",)}


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--outbox", "jdbc:postgresql://127.0.0.1:99999/x"], r"invalid URL .*Port out of range"),
        (["--config", "{bad}"], r"'inbox' must be an array of tables"),
        (["--fail-above", "duplicate=1.9"], r"--fail-above 'duplicate=1\.9': use CLASS=N"),
        (["--fail-above", "duplicat=1"], r"--fail-above: unknown threshold class 'duplicat'"),
        (["--sla", "-1h"], r"--sla: invalid duration '-1h': not positive"),
        (["--sla", "1e30d"], r"--sla: invalid duration '1e30d': too long"),
        (["--subscribe", "orders"], r"--subscribe 'orders': use TOPIC=consumer1,consumer2"),
        (["--since", "yesterday"], r"--since 'yesterday': not a time; use ISO 8601"),
        (
            ["--inbox", "jdbc:postgresql://127.0.0.1/b", "--inbox", "postgresql://127.0.0.1/b"],
            r"'inbox1' and 'inbox2' both read 127\.0\.0\.1:5432/b",
        ),
    ],
)
def test_cli_bad_configuration_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], error: str
) -> None:
    bad = _job_file(tmp_path, f'[inbox]\nurl = "{URL}"')
    base = ["reconcile", "--outbox", URL, "--subscribe", "orders=billing", "--no-record"]
    if "--inbox" not in args and "--config" not in args:
        base += ["--inbox", "jdbc:postgresql://127.0.0.1/billing"]
    result = CliRunner().invoke(main, [*base, *(a.format(bad=bad) for a in args)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    assert re.search(error, lines[0]), lines[0]


# --- sizing the reads: max_connections, rows_per_partition, partitions ------------------------


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "4", None])
def test_source_max_connections_must_be_a_whole_number_from_1(value: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        Source("billing", URL, max_connections=value)  # type: ignore[arg-type]
    assert str(err.value) == (
        "source 'billing': max_connections must be a whole number >= 1 "
        f"(e.g. max_connections = 4), got {value!r}"
    )
    assert err.value.key == "max_connections"


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"partitions": 0}, r"job: partitions must be a whole number >= 1 .*, got 0$"),
        ({"partitions": -2}, r"partitions must be a whole number >= 1 .*, got -2$"),
        ({"rows_per_partition": 0}, r"job: rows_per_partition must be a whole number .*, got 0$"),
        ({"rows_per_partition": True}, r"rows_per_partition must be a whole number .*, got True$"),
        ({"rows_per_partition": 1e5}, r"rows_per_partition must be .*, got 100000\.0$"),
        (
            {
                "outbox": Source("outbox", "jdbc:postgresql://h/app", max_connections=1),
                "inboxes": (Source("billing", "postgresql://H:5432/app", schema="billing"),),
            },
            r"sources 'outbox', 'billing' read h:5432/app at once: 2 reads need "
            r"max_connections >= 2 there, not 1",
        ),
    ],
)
def test_job_config_rejects_bad_read_sizing(overrides: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        _config(**overrides)


def test_job_config_read_sizing_defaults_and_one_database_shared() -> None:
    config = _config()
    assert (config.partitions, config.rows_per_partition) == (None, 200_000)
    assert config.outbox.max_connections == 4
    shared = _config(
        outbox=Source("outbox", "jdbc:postgresql://h/app", max_connections=2),
        inboxes=(Source("billing", "jdbc:postgresql://h/app", schema="billing"),),
    )
    assert shared.inboxes[0].max_connections == 4


def test_load_toml_reads_max_connections_and_rows_per_partition(tmp_path: Path) -> None:
    text = GOOD.replace('user = "recon"', 'user = "recon"\nmax_connections = 8')
    got = load_toml(_job_file(tmp_path, "rows_per_partition = 50000\n" + text))
    assert got["rows_per_partition"] == 50_000
    assert got["outbox"].max_connections == 8
    assert [s.max_connections for s in got["inboxes"]] == [4, 4]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            f'[outbox]\nurl = "{URL}"\nmax_connections = 0',
            r"\[outbox\]: max_connections must be a whole number >= 1 .*, got 0$",
        ),
        (
            f'[[inbox]]\nurl = "{URL}"\nmax_connections = "4"',
            r"\[\[inbox\]\] #1: max_connections must be a whole number >= 1 .*, got '4'$",
        ),
        ("rows_per_partition = -5", r"job file .*: rows_per_partition must be a whole .*, got -5$"),
        ('rows_per_partition = "big"', r"rows_per_partition must be a whole number .*, got 'big'$"),
        ("rows_per_partition = 1.5", r"rows_per_partition must be a whole number .*, got 1\.5$"),
    ],
)
def test_load_toml_rejects_bad_read_sizing(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        load_toml(_job_file(tmp_path, text))


def test_cli_takes_read_sizing_from_the_job_file(tmp_path: Path) -> None:
    text = "rows_per_partition = 9\n" + GOOD.replace(
        'user = "recon"', 'user = "recon"\nmax_connections = 2'
    )
    config = _job_config(_opts(config_file=str(_job_file(tmp_path, text)), user="flag-user"))
    assert config.rows_per_partition == 9
    assert [s.max_connections for s in (config.outbox, *config.inboxes)] == [2, 4, 4]
    assert _job_config(_opts(config_file=str(_job_file(tmp_path, GOOD)))).rows_per_partition == (
        200_000
    )


def test_cli_bad_read_sizing_in_the_job_file_is_exit_2(tmp_path: Path) -> None:
    job = _job_file(tmp_path, "rows_per_partition = 0\n" + GOOD)
    result = CliRunner().invoke(main, ["reconcile", "--config", str(job), "--no-record"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    expected = r"^error: job file .*: rows_per_partition must be a whole.*, got 0$"
    assert re.search(expected, line), line


TLS_URL = (
    "jdbc:postgresql://db.example:5433/app?sslmode=verify-full&sslrootcert=/etc/ca.pem"
    "&sslcert=/etc/client.pem&sslkey=/etc/client.key&channel_binding=require"
    "&connect_timeout=7&application_name=recon&user=recon"
)


def test_tls_parameters_reach_both_drivers_by_their_names(monkeypatch: Any) -> None:
    monkeypatch.setenv("RECON_KEY_PASSPHRASE", "key-s3cret")
    src = Source("outbox", TLS_URL, sslpassword_env="RECON_KEY_PASSPHRASE")
    assert src.jdbc_url == "jdbc:postgresql://db.example:5433/app"  # the properties carry them
    assert src.jdbc_properties() == {
        "driver": "org.postgresql.Driver",
        "fetchsize": "10000",
        "user": "recon",
        "sslmode": "verify-full",
        "sslrootcert": "/etc/ca.pem",
        "sslcert": "/etc/client.pem",
        "sslkey": "/etc/client.key",
        "channelBinding": "require",
        "connectTimeout": "7",
        "ApplicationName": "recon",
        "sslpassword": "key-s3cret",
    }
    assert src.libpq_kwargs() == {
        "host": "db.example",
        "port": 5433,
        "dbname": "app",
        "user": "recon",
        "sslmode": "verify-full",
        "sslrootcert": "/etc/ca.pem",
        "sslcert": "/etc/client.pem",
        "sslkey": "/etc/client.key",
        "channel_binding": "require",
        "connect_timeout": "7",
        "application_name": "recon",
        "sslpassword": "key-s3cret",
    }
    assert "key-s3cret" not in repr(src)
    plain = Source("outbox", URL)
    assert set(plain.jdbc_properties()) == {"driver", "fetchsize"}
    assert set(plain.libpq_kwargs()) == {"host", "port", "dbname"}


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("sslcrl=/etc/crl.pem", "'sslcrl' is not one the job passes to both drivers"),
        ("ssl=true", "'ssl' is not one the job passes"),
        ("sslpassword=key-s3cret", "sslpassword_env"),
        ("password=s3cret", "password_env / password_file"),
        ("sslmode=", "'sslmode' is empty"),
    ],
)
def test_a_url_parameter_neither_driver_would_honour_alike_is_refused(
    query: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as err:
        Source("outbox", f"{URL}?{query}")
    assert problem in str(err.value)
    assert "s3cret" not in str(err.value)


def test_an_unset_key_passphrase_variable_is_named(monkeypatch: Any) -> None:
    monkeypatch.delenv("NO_SUCH_PASSPHRASE", raising=False)
    src = Source("outbox", f"{URL}?sslkey=/k.pem", sslpassword_env="NO_SUCH_PASSPHRASE")
    with pytest.raises(ConfigurationError, match="NO_SUCH_PASSPHRASE is not set"):
        src.jdbc_properties()


def test_the_job_file_takes_the_key_passphrase_variable(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        f'[outbox]\nurl = "{URL}?sslmode=require"\nsslpassword_env = "RECON_KEY_PASSPHRASE"\n'
    )
    outbox = load_toml(path)["outbox"]
    assert outbox.sslpassword_env == "RECON_KEY_PASSPHRASE"
    assert outbox.parameters() == {"sslmode": "require"}
