"""The broker contract suite (relay.contract: the publisher's contract and the wire codec's
round trip) on every built-in broker, the matrix of conftest.py."""

from __future__ import annotations

from relay.contract import *  # noqa: F403 - the suite's tests, collected here
from tests.contract.conftest import BUILT_INS, HARNESSES


def test_every_built_in_broker_has_a_harness() -> None:
    assert BUILT_INS, "no broker registered: is the package installed (pip install -e .)?"
    assert [n for n in BUILT_INS if n not in HARNESSES] == []
