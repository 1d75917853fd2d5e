"""``receive`` / ``record`` and their async flavours: the inbox record in the caller's
transaction.

The async calls are written once in ``inbox/_receive_async.py``; the sync ones are generated
from them into ``inbox/_receive_sync.py`` by ``tools/async_to_sync.py``; what both decide is
``inbox/_receive_common.py``. This module is where the rest of the package imports them from.
"""

from __future__ import annotations

from inbox._receive_async import receive_async, record_async, record_on_async, run_steps_async
from inbox._receive_common import (
    _CHECKED_NAMES,
    _MAX_CHECKED_NAMES,
    MessageRef,
    Step,
    Steps,
    Verdict,
    _record_steps,
    as_ref,
    decide,
    held_params,
    invalid_ref,
    translate,
)
from inbox._receive_sync import receive, record, record_on, run_steps

__all__ = [
    "_CHECKED_NAMES",
    "_MAX_CHECKED_NAMES",
    "MessageRef",
    "Step",
    "Steps",
    "Verdict",
    "_record_steps",
    "as_ref",
    "decide",
    "held_params",
    "invalid_ref",
    "receive",
    "receive_async",
    "record",
    "record_async",
    "record_on",
    "record_on_async",
    "run_steps",
    "run_steps_async",
    "translate",
]
