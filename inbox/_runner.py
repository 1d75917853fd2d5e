"""The handler runners: one transaction per delivery, recorded, handled, committed; an outcome.

:class:`AsyncHandlerRunner` is written once in ``inbox/_runner_async.py``;
:class:`HandlerRunner` is generated from it into ``inbox/_runner_sync.py`` by
``tools/async_to_sync.py``; what both decide is ``inbox/_runner_common.py``. This module is
where the rest of the package imports them from.
"""

from __future__ import annotations

from inbox._handler import AsyncBatchHandler, AsyncHandler, BatchHandler, Handler
from inbox._runner_async import AsyncHandlerRunner
from inbox._runner_common import (
    ON_DEAD,
    Also,
    AsyncAlso,
    AsyncBatchAlso,
    BatchAlso,
    Outcome,
    Result,
    _is_transient,
)
from inbox._runner_sync import HandlerRunner

__all__ = [
    "ON_DEAD",
    "Also",
    "AsyncAlso",
    "AsyncBatchAlso",
    "AsyncBatchHandler",
    "AsyncHandler",
    "AsyncHandlerRunner",
    "BatchAlso",
    "BatchHandler",
    "Handler",
    "HandlerRunner",
    "Outcome",
    "Result",
    "_is_transient",
]
