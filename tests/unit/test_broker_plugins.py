"""Brokers are found through the entry-point group ``outbox_inbox.brokers`` (outbox/brokers.py):
the built-in ones like any plug-in; a broken or conflicting plug-in is left out with one line
naming it, and every other broker keeps working."""

from __future__ import annotations

import dataclasses
import logging
import tomllib
from pathlib import Path
from typing import Any

import pytest

from outbox import brokers
from outbox.brokers import BUILT_IN, ENTRY_POINT_GROUP, BrokerPlugin
from outbox.exceptions import ConfigurationError
from relay.brokers import SCHEMES, publisher_for_url

ROOT = Path(__file__).resolve().parents[2]
FAKE = BrokerPlugin(
    name="fake", schemes=("fake",), publisher="relay.brokers.memory:MemoryPublisher",
    url_parser="relay.brokers.urls:no_arguments",
)  # fmt: skip
SAME = dataclasses.replace(FAKE, name="same")


@dataclasses.dataclass
class _Dist:
    name: str


@dataclasses.dataclass
class _Point:
    """An entry point as importlib.metadata gives it (name, value, dist, load())."""

    name: str
    target: Any
    dist: _Dist

    @property
    def value(self) -> str:
        return f"{self.dist.name.replace('-', '_')}:{self.name.upper()}"

    def load(self) -> Any:
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def _builtin_points() -> list[_Point]:
    from relay.brokers import plugins as builtins

    return [_Point(p.name, p, _Dist(BUILT_IN)) for p in vars(builtins).values()
            if isinstance(p, BrokerPlugin)]  # fmt: skip


def _use(monkeypatch: pytest.MonkeyPatch, *extra: _Point) -> None:
    registry = brokers._discover([*_builtin_points(), *extra])  # type: ignore[list-item]
    monkeypatch.setattr(brokers, "_registry", lambda: registry)


def test_the_built_in_brokers_register_through_the_entry_point_group() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    names = set(declared[ENTRY_POINT_GROUP])
    assert names == {p.name for p in brokers.plugins().values() if p.distribution == BUILT_IN}
    assert brokers.problems() == []
    assert {"nats", "amqp", "kafka", "redis", "mqtt", "stdout", "file", "sqs", "sns"} <= set(
        SCHEMES
    )


def test_a_plugin_that_fails_to_load_is_left_out_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox.brokers"):
        _use(monkeypatch, _Point("broken", ImportError("No module named 'zmq'"), _Dist("acme-zmq")))
    (problem,) = brokers.problems()
    assert problem == (
        "broker plug-in 'broken' (acme-zmq, acme_zmq:BROKEN) failed to load: "
        "ImportError: No module named 'zmq'"
    )
    assert [r.getMessage() for r in caplog.records] == [problem]
    assert type(publisher_for_url("memory:")).__name__ == "MemoryPublisher"  # the rest work
    with pytest.raises(ConfigurationError, match=r"unknown broker URL 'zmq://h'.*'broken'"):
        publisher_for_url("zmq://h")


def test_an_object_that_is_not_a_plugin_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _Point("odd", {"schemes": ["odd"]}, _Dist("acme-odd")))
    assert brokers.problems() == [
        "broker plug-in 'odd' (acme-odd, acme_odd:ODD) is a dict, not an "
        "outbox.brokers.BrokerPlugin"
    ]


def test_a_built_in_scheme_stays_built_in(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _Point("fake", dataclasses.replace(FAKE, schemes=("redis", "fake")),
                             _Dist("acme-fake")))  # fmt: skip
    assert brokers.plugin_for_scheme("redis").name == "redis"  # type: ignore[union-attr]
    assert brokers.plugin_for_scheme("fake").name == "fake"  # type: ignore[union-attr]
    assert brokers.problems() == [
        "broker plug-in 'fake' (acme-fake) claims scheme 'redis', a built-in broker's (redis); "
        "its claim is ignored"
    ]


def test_two_plugins_claiming_one_scheme_both_lose_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _Point("fake", FAKE, _Dist("acme-a")), _Point("same", SAME, _Dist("acme-b")))
    with pytest.raises(ConfigurationError, match=r"^broker URL scheme 'fake' is claimed by the "
                       r"plug-ins 'fake' and 'same': uninstall one of them$"):  # fmt: skip
        publisher_for_url("fake:")
    assert "fake" not in brokers.schemes()
    assert type(publisher_for_url("stdout:")).__name__ == "StdoutPublisher"


def test_a_plugin_part_that_cannot_be_loaded_names_the_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = dataclasses.replace(FAKE, publisher="acme_nothing.publisher:Publisher")
    _use(monkeypatch, _Point("fake", gone, _Dist("acme-fake")))
    expected = r"^broker plug-in 'fake' \(acme-fake\): its publisher 'acme_nothing.publisher"
    with pytest.raises(ConfigurationError, match=expected):
        publisher_for_url("fake:")


def test_every_built_in_consumer_is_a_broker_consumer() -> None:
    from inbox import BrokerConsumer

    for plugin in brokers.plugins().values():
        if plugin.consumer:
            assert issubclass(plugin.load("consumer"), BrokerConsumer), plugin.name
        if plugin.codec:
            codec = plugin.load("codec")
            assert callable(codec.encode), plugin.name
            assert callable(codec.decode), plugin.name
