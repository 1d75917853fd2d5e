"""The relay's operator functions live in relay.admin, beside inbox.admin; their old names on
relay still work for one release and warn."""

from __future__ import annotations

import warnings

import pytest

import relay
import relay.admin

MOVED = (
    "DeadFilter", "RelayStatus", "dead_list", "dead_purge", "dead_retry", "delete_published",
    "disable_capture", "enable_capture", "relay_status",
)  # fmt: skip


@pytest.mark.parametrize("name", MOVED)
def test_an_old_name_warns_and_is_the_admin_one(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay, "_warned", set())
    with pytest.warns(DeprecationWarning, match=f"relay.{name} is deprecated"):
        old = getattr(relay, name)
    assert old is getattr(relay.admin, name)


def test_the_relay_namespace_has_no_operator_function() -> None:
    assert not set(MOVED) & set(relay.__all__)
    assert set(MOVED) <= set(relay.admin.__all__)
    star: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a star import touches no deprecated alias
        exec("from relay import *", star)
    assert "dead_list" not in star
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        relay.nothing_here  # noqa: B018
