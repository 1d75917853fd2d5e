"""``publish`` and ``publish_batch`` and their async flavours: write messages in the caller's
transaction.

The async calls are written once in ``outbox/_publish_async.py``; the sync ones are generated
from them into ``outbox/_publish_sync.py`` by ``tools/async_to_sync.py``; what both do before
and after their I/O is ``outbox/_publish_common.py``. This module is where the rest of the
package imports them from.
"""

from __future__ import annotations

from outbox._publish_async import publish_async, publish_batch_async
from outbox._publish_common import _record
from outbox._publish_sync import publish, publish_batch

__all__ = ["_record", "publish", "publish_async", "publish_batch", "publish_batch_async"]
