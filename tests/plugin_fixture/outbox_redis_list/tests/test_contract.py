"""The broker contract suite of outbox-inbox, run on this plug-in."""

from relay.contract import *  # noqa: F403 - the suite's tests
from relay.contract import harness_fixture

adapter = harness_fixture("redis-list")
