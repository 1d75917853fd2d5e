"""inbox.admin holds the operator functions; their old names on inbox warn once and work."""

from __future__ import annotations

import importlib
import warnings

import pytest

import inbox
import inbox.admin

_OLD_TO_NEW = {
    "BlockedKey": "BlockedKey",
    "HeldFilter": "HeldFilter",
    "HeldKey": "HeldKey",
    "blocked_keys": "blocked_keys",
    "dead_audit": "dead_audit",
    "dead_purge": "dead_purge",
    "dead_retry": "dead_retry",
    "held_keys": "held_keys",
    "purge": "purge_finished",
}


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which aliases already warned in this process."""
    monkeypatch.setattr(inbox, "_warned", set())


@pytest.mark.parametrize(("old", "new"), sorted(_OLD_TO_NEW.items()))
def test_old_name_warns_and_is_the_admin_function(fresh: None, old: str, new: str) -> None:
    expected = rf"inbox\.{old} is deprecated.*inbox\.admin\.{new}"
    with pytest.warns(DeprecationWarning, match=expected):
        alias = getattr(inbox, old)
    assert alias is getattr(inbox.admin, new)


def test_alias_warns_once_per_name(fresh: None) -> None:
    with pytest.warns(DeprecationWarning, match="inbox.purge is deprecated"):
        from inbox import purge  # noqa: F401
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from inbox import purge as again

    assert again is inbox.admin.purge_finished


def test_the_warning_points_at_the_caller(fresh: None) -> None:
    with pytest.warns(DeprecationWarning, match="inbox.held_keys") as caught:
        inbox.held_keys  # noqa: B018
    assert caught[0].filename == __file__


def test_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        inbox.nothing_here  # noqa: B018


def test_admin_names_are_not_in_the_consumer_namespace() -> None:
    assert not set(_OLD_TO_NEW) & set(inbox.__all__)
    # the moved names, and what the console reads that was never on inbox
    assert set(inbox.admin.__all__) == {
        *_OLD_TO_NEW.values(),
        "ConsumerActivity",
        "consumer_activity",
        "PartitionLease",  # `outbox inbox partitions`: who holds each partition
        "partition_leases",
    }
    star: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a star import touches no deprecated alias
        exec("from inbox import *", star)
    assert "purge" not in star
    assert importlib.import_module("inbox.admin").purge_finished is inbox.admin.purge_finished
