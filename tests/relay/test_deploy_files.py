"""The deployment files shipped in the package (relay/deploy): the systemd unit passes
``systemd-analyze verify`` (else, where systemd is absent, a parse of its sections and keys),
its ``ExecStart`` is a command the CLI takes, and the environment file and the settings file
load into a relay configuration that builds the publisher they describe."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

from relay import RelayConfig
from relay.cli import make_publisher
from tests.support.services import import_or_missing

DEPLOY = files("relay").joinpath("deploy")
OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _unit(tmp_path: Path) -> tuple[Path, str]:
    """The unit with its paths pointed at this machine's: the outbox command, the env file."""
    text = DEPLOY.joinpath("outbox-relay.service").read_text()
    env = tmp_path / "relay.env"
    env.write_text(DEPLOY.joinpath("outbox-relay.env").read_text())
    text = text.replace("/opt/outbox/bin/outbox", OUTBOX).replace("/etc/outbox/relay.env", str(env))
    unit = tmp_path / "outbox-relay.service"
    unit.write_text(text)
    return unit, text


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit, _ = _unit(tmp_path)
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze here: test_the_unit_parses checks the unit")
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    # verify exits 0 even when it ignores a line it cannot parse: that line is on stderr
    problems = [line for line in done.stderr.splitlines() if unit.name in line]
    assert done.returncode == 0, done.stderr
    assert problems == [], problems


def test_the_unit_parses_and_its_command_is_one_the_cli_takes(tmp_path: Path) -> None:
    _, text = _unit(tmp_path)
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(text)
    assert parser.sections() == ["Unit", "Service", "Install"]
    service = parser["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > RelayConfig(database_url="x=y").shutdown_timeout
    assert service["RestartPreventExitStatus"] == "2"  # a configuration error: no restart loop
    argv = shlex.split(service["ExecStart"])
    assert argv[:2] == [OUTBOX, "relay"]
    toml = tmp_path / "relay.toml"
    toml.write_text(DEPLOY.joinpath("relay.toml").read_text())
    argv[argv.index("--config") + 1] = str(toml)
    done = subprocess.run([*argv[:2], "--help"], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for option in argv[2::2]:
        assert option in done.stdout, f"ExecStart uses {option}, which outbox relay lacks"


def test_the_env_file_and_the_settings_file_build_the_publisher_they_describe(
    tmp_path: Path,
) -> None:
    import_or_missing("nats", "nats")
    env = {}
    for line in DEPLOY.joinpath("outbox-relay.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    assert set(env) == {"OUTBOX_DATABASE_URL", "OUTBOX_BROKER_URL"}
    toml = tmp_path / "relay.toml"
    toml.write_text(DEPLOY.joinpath("relay.toml").read_text())
    config = RelayConfig.load(toml, env=env)
    assert config.metrics_port == 9464
    assert config.database_url == env["OUTBOX_DATABASE_URL"]
    pub = make_publisher(config)
    assert type(pub).__name__ == "NatsPublisher"
    assert pub._stream == "ORDERS"  # type: ignore[attr-defined]
    assert pub._destination("orders") == "orders.orders"  # type: ignore[attr-defined]


def test_the_how_tos_settings_files_load(tmp_path: Path) -> None:
    """Every TOML block of docs/how-to/run-the-relay.md is a settings file the relay takes."""
    import re

    page = Path(__file__).parents[2] / "docs" / "how-to" / "run-the-relay.md"
    blocks = re.findall(r"^ *```toml\n(.*?)^ *```", page.read_text(), re.DOTALL | re.MULTILINE)
    assert len(blocks) >= 2
    for index, block in enumerate(blocks):
        toml = tmp_path / f"block{index}.toml"
        toml.write_text("\n".join(line.strip() for line in block.splitlines()))
        config = RelayConfig.load(toml, env={})
        assert config.broker_url is not None, f"block {index} names no broker"
