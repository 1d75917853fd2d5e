"""The ``[broker]`` options come from the adapters' signatures (relay/_broker_config.py): an
option an adapter gains is a setting of the daemon without other code, including one typed
with a dataclass (CloudEvents-like formats), which the file gives as a table of its fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from outbox import brokers as outbox_brokers
from outbox.brokers import BrokerPlugin
from outbox.exceptions import ConfigurationError
from relay._broker_config import object_options, options_for, validate_options


@dataclasses.dataclass(frozen=True)
class Format:
    source: str
    structured: bool = False

    def __post_init__(self) -> None:
        if not self.source:
            raise ConfigurationError("Format source must not be empty")


class FakePublisher:
    def __init__(
        self,
        *,
        destinations: Mapping[str, str] | None = None,
        fmt: Format | None = None,
        batch_bytes: int = 1024,
    ) -> None:
        self.fmt, self.batch_bytes = fmt, batch_bytes


@pytest.fixture
def fake_scheme(monkeypatch: pytest.MonkeyPatch) -> str:
    """A broker registered for the test (outbox.brokers), its publisher this module's."""
    plugin = BrokerPlugin(
        name="fake", schemes=("fake",), publisher=f"{__name__}:FakePublisher",
        url_parser="relay.brokers.urls:no_arguments",
    )  # fmt: skip
    monkeypatch.setitem(outbox_brokers._registry().by_scheme, "fake", plugin)
    return "fake:"


def test_a_new_adapter_option_is_a_setting_with_its_kind(fake_scheme: str) -> None:
    known = options_for("fake")
    assert known["batch_bytes"].kinds == ("int",)
    assert known["fmt"].accepts() == "a table of Format's fields"
    with pytest.raises(ConfigurationError, match=r"^\[broker\]: batch_bytes must be an integer"):
        validate_options(fake_scheme, {"batch_bytes": "big"})


def test_a_dataclass_option_is_built_from_its_table(fake_scheme: str) -> None:
    built = object_options(fake_scheme, {"fmt": {"source": "//shop", "structured": True}})
    assert built["fmt"] == Format("//shop", structured=True)
    origin = {"fmt": "config file relay.toml: [broker]"}
    with pytest.raises(ConfigurationError, match=r"^config file relay.toml: \[broker\]: fmt: .*"
                       r"unexpected keyword argument 'sauce'"):  # fmt: skip
        validate_options(fake_scheme, {"fmt": {"sauce": "x"}}, origin)
    with pytest.raises(ConfigurationError, match="fmt: Format source must not be empty"):
        validate_options(fake_scheme, {"fmt": {"source": ""}}, origin)
